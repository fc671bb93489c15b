from .spring import Spring, SpringData
from .chemistry import Chemistry, ChemistryData
from .burgers import Burgers, BurgersData
from .darcy import Darcy, DarcyData

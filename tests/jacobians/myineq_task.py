"""-u'' = f on (0, 2), u(0) = u(2) = 0, exact u = sin(pi x)^2 >= 0 (touches 0 at x = 1 too); u >= 0 imposed."""
import math, lightning.pytorch as pl, torch
from torch.utils.data import DataLoader
from lit_constrained import ConstrainedModule, Imposed
from lit_constrained.physics import Box, partial

exact = lambda x: torch.sin(math.pi * x[:, 0]) ** 2
line = Box([0.0], [2.0])

class Data(pl.LightningDataModule):
    def __init__(self):
        super().__init__(); x = line.grid(2001, dtype=torch.float32); self.val = (x, exact(x))
    def train_dataloader(self): return DataLoader([0], batch_size=None)
    def val_dataloader(self): return DataLoader([self.val], batch_size=None)

class Positive(ConstrainedModule):
    def __init__(self, hidden: int = 32, n_bound: int = 41, **kwargs):
        super().__init__(**kwargs)
        self.net = torch.nn.Sequential(torch.nn.Linear(1, hidden), torch.nn.Tanh(), torch.nn.Linear(hidden, hidden),
                                       torch.nn.Tanh(), torch.nn.Linear(hidden, 1))
        self.register_buffer("x_pde", line.interior(128, "sobol", seed=1, dtype=torch.float32))
        self.register_buffer("x_ends", line.boundary(2, dtype=torch.float32))
        self.register_buffer("x_bound", line.grid(n_bound, dtype=torch.float32))
    def forward(self, x): return self.net(x)[:, 0]
    def pde(self, x): return -partial(self, x, 0, order=2) + partial(exact, x, 0, order=2)
    def objective(self, batch): return self.pde(self.x_pde).pow(2).mean() + self(self.x_ends).pow(2).mean()
    def imposed(self, batch):
        return {"ends": Imposed(self, self.x_ends), "positive": Imposed(self, self.x_bound, sense=">=")}
    def evaluation_metrics(self, batch, stage):
        x, u = batch
        with torch.no_grad():
            v = self(x); return {"rel_l2": (v - u).norm() / u.norm(), "below_zero": (-v).clamp(min=0).max()}

"""``python -m lit_constrained.compare ...`` (the same as ``lit-constrained compare ...``)."""

import sys

from lit_constrained.compare import main

sys.exit(main())

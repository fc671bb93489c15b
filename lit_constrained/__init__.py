"""lit_constrained: hard equality constraints during training, with PyTorch Lightning."""

__version__ = "0.1.0"

"""Small helpers shared by the physics tasks' modules: the MLP builder and dtype names.

Nothing here knows about a particular problem. The tasks' data live on
:class:`~lit_constrained.tasks.datamodule.RowDataModule` (batches from
:mod:`~lit_constrained.tasks.sampling`, arrays cached by :mod:`~lit_constrained.tasks.cache`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import torch
from torch import nn

DTypeName = Literal["float32", "float64"]


def mlp(
    in_dim: int,
    hidden: int,
    depth: int,
    out_dim: int,
    activation: Callable[[], nn.Module] = nn.Tanh,
    features: nn.Module | None = None,
) -> nn.Sequential:
    """A fully connected network ``in_dim -> hidden x depth -> out_dim``.

    ``depth`` is the number of hidden layers; each is ``Linear`` followed by ``activation()``; the
    output layer is linear. Weights use PyTorch's default ``nn.Linear`` initialization (seed it
    with ``torch.manual_seed`` / ``seed_everything`` before building). ``features``: a fixed first layer
    of ``in_dim`` inputs and ``features.out_features`` outputs (e.g.
    :class:`~lit_constrained.physics.features.FourierFeatures`), the first ``Linear`` taking its outputs.

    Example:
        >>> net = mlp(1, 32, 3, 1)
        >>> sum(p.numel() for p in net.parameters())
        2209
    """
    for name, value in (("in_dim", in_dim), ("hidden", hidden), ("out_dim", out_dim)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"mlp: {name} must be a positive integer, got {value!r}.")
    if not isinstance(depth, int) or depth < 0:
        raise ValueError(f"mlp: depth (number of hidden layers) must be an integer >= 0, got {depth!r}.")
    layers: list[nn.Module] = []
    width = in_dim
    if features is not None:
        layers.append(features)
        width = int(features.out_features)
    for _ in range(depth):
        layers += [nn.Linear(width, hidden), activation()]
        width = hidden
    layers.append(nn.Linear(width, out_dim))
    return nn.Sequential(*layers)


def torch_dtype(name: str) -> torch.dtype:
    """``"float32"`` / ``"float64"`` to the torch dtype, with a clear error otherwise."""
    table = {"float32": torch.float32, "float64": torch.float64}
    if name not in table:
        raise ValueError(f"dtype must be one of {sorted(table)}, got {name!r}.")
    return table[name]

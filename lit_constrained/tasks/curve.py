"""A minimal example task: fit a curve to noisy samples, with its values pinned exactly at anchors.

objective: mean squared error on the noisy samples of y = sin(2 pi x) on [0, 1] (``Objective/val``:
the same on 101 held-out noisy samples); constraints (m = number of anchors): net(x_a) - sin(2 pi x_a)
= 0 at the anchors. Test metric ``val/mse``: the error against the exact curve sin(2 pi x).
It trains in seconds on a CPU; the physics tasks (spring, chemistry, burgers, darcy) follow the
same pattern.
"""

from __future__ import annotations

import math
from typing import Any

import lightning.pytorch as pl
import torch
from torch import Tensor
from torch.utils.data import DataLoader, TensorDataset

from .sampling import EpochShuffleSampler, ResumableLoader
from ..module import ConstrainedModule
from ..module_parts.trainer_checks import attached_trainer


def target(x: Tensor) -> Tensor:
    return torch.sin(2 * math.pi * x)


class CurveData(pl.LightningDataModule):
    """Noisy samples of sin(2 pi x), generated from a seed."""

    def __init__(self, num_samples: int = 256, noise: float = 0.1, batch_size: int = 256, seed: int = 0) -> None:
        super().__init__()
        self.save_hyperparameters()
        gen = torch.Generator().manual_seed(seed)
        x = torch.rand(num_samples, 1, generator=gen)
        y = target(x) + noise * torch.randn(num_samples, 1, generator=gen)
        self.train_set = TensorDataset(x, y)
        x_val = torch.linspace(0, 1, 101).unsqueeze(-1)  # held-out noisy samples (objective); metric: exact
        self.val_set = TensorDataset(x_val, target(x_val) + noise * torch.randn(101, 1, generator=gen))

    def train_dataloader(self) -> DataLoader:
        # seeded shuffle + saved position in the epoch: a resumed run takes the uninterrupted run's steps
        sampler = EpochShuffleSampler(len(self.train_set), seed=self.hparams.seed)
        return ResumableLoader(self.train_set, batch_size=self.hparams.batch_size, sampler=sampler)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val_set, batch_size=len(self.val_set))

    def test_dataloader(self) -> DataLoader:
        return self.val_dataloader()


class CurveFit(ConstrainedModule):
    """An MLP y(x) fitted to noisy data, with y(x_a) = sin(2 pi x_a) imposed exactly at the anchors."""

    def __init__(self, hidden: int = 32, anchors: list[float] = [0.1, 0.5, 0.8], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.net = torch.nn.Sequential(
            torch.nn.Linear(1, hidden), torch.nn.Tanh(), torch.nn.Linear(hidden, hidden), torch.nn.Tanh(),
            torch.nn.Linear(hidden, 1),
        )
        anchor_x = torch.tensor(anchors, dtype=torch.float32).unsqueeze(-1)
        self.register_buffer("anchor_x", anchor_x)
        self.register_buffer("anchor_y", target(anchor_x).squeeze(-1))

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)

    def objective(self, batch: Any) -> Tensor:
        x, y = batch
        return (self.net(x) - y).pow(2).mean()

    def constraints(self, batch: Any) -> Tensor:
        return self.net(self.anchor_x).squeeze(-1) - self.anchor_y

    def evaluation_metrics(self, batch: Any, stage: str) -> dict[str, Tensor]:
        """``mse``: the mean squared error against the exact curve sin(2 pi x) (not the noisy samples)."""
        x, _ = batch
        with torch.no_grad():
            return {"mse": (self.net(x) - target(x)).pow(2).mean()}

    @torch.no_grad()
    def prediction_figure(self) -> Any:
        """The exact curve, the network, the noisy training samples and the anchors."""
        datamodule = getattr(attached_trainer(self), "datamodule", None)
        if not isinstance(datamodule, CurveData):
            return None
        from lit_constrained.module_parts.tensorboard import small_figure

        x_train, y_train = datamodule.train_set.tensors
        x = torch.linspace(0, 1, 201).unsqueeze(-1)
        prediction = self.net(x.to(self.device, self.dtype)).cpu().double().squeeze(-1)
        mse = float((prediction - target(x).double().squeeze(-1)).pow(2).mean())
        fig, ax = small_figure()
        ax.scatter(x_train.squeeze(-1), y_train.squeeze(-1), s=6, color="0.7", label="noisy samples")
        ax.plot(x.squeeze(-1), target(x).squeeze(-1), color="0.3", lw=2, label="sin(2 pi x)")
        ax.plot(x.squeeze(-1), prediction, color="tab:blue", label="network")
        ax.scatter(self.anchor_x.cpu().squeeze(-1), self.anchor_y.cpu(), color="tab:red", marker="x", s=60,
                   zorder=4, label="anchors (imposed)")
        ax.set(xlabel="x", ylabel="y", title=f"val/mse {mse:.2e}")
        ax.legend(loc="lower left", fontsize=9)
        return fig

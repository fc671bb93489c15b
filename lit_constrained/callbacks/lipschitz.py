r"""Set Adam's "exact" constant step size :math:`\alpha = \sqrt{2 \mathcal{L}(w_0) / (\hat L T)}` at fit start.

The estimate is :func:`lit_constrained.optim.lipschitz.estimate_lipschitz` (the math is there); this
callback feeds it the training batches, the strategy's reduce and a seed, then writes :math:`\alpha`
into the optimizers with :func:`lit_constrained.optim.lr_setting.set_lr`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any, Literal

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.utilities.data import extract_batch_size
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from lightning.pytorch.utilities.rank_zero import rank_zero_info, rank_zero_warn
from lightning.pytorch.utilities.seed import isolate_rng
from torch import Tensor

from lit_constrained.batch import as_task_sees_it
from lit_constrained.optim.constant_step_adam import ConstantStepAdam
from lit_constrained.optim.lipschitz import (
    check_estimate_settings, constant_step_size, estimate_lipschitz, parameters_without_reset, reset_all_parameters,
)
from lit_constrained.optim.lr_setting import set_lr

__all__ = ["LipschitzEstimator", "reset_all_parameters"]

LossFn = Callable[[LightningModule, Any], Tensor]
Sampler = Callable[[LightningModule], None]


class LipschitzEstimator(Callback):
    r"""Set :math:`\alpha = \sqrt{2 \mathcal{L}(w_0) / (\hat L T)}` in ``on_train_start`` (optimizers built, no step yet).

    :math:`\mathcal{L}(w_0)` and :math:`\hat L` come from :func:`~lit_constrained.optim.lipschitz.estimate_lipschitz`
    (the math and its caveat are there) over the training batches, each weighted by its size
    (``extract_batch_size``; 1 without a tensor), under DDP over all ranks' batches; the loss is
    ``objective(batch)`` alone (no constraints, no penalty) and the gradients are taken with respect to the
    optimizers' parameters; :math:`T` = ``trainer.estimated_stepping_batches``. Weights, buffers, ``.grad``,
    optimizer state, global RNGs and the training loader (its generators, its ``state_dict``) are left as
    found, so training sees the batches it would see without the callback.

    :math:`\alpha` goes into every group of a ``ConstantStepAdam`` and every group whose ``lr`` is ``None``
    (every group with ``apply_to_any_optimizer=True``), through :func:`~lit_constrained.optim.lr_setting.set_lr`:
    a scheduler keeps its factor and gets :math:`\alpha` as base lr (with a warning: the paper's step is
    constant). Writing nowhere warns. A resumed fit restores the numbers and the lr; it does not re-estimate.

    Args:
        num_samples: :math:`N`, the number of weight samples.
        mode: ``"full"`` (Algorithm 2) or ``"minibatch"`` (Algorithm 3).
        max_batches: use only the first ``max_batches`` training batches of each pass (``None``: all).
        seed: seed of the weight draws; ``None`` draws one from torch's RNG on rank 0 (after the
            :math:`\mathcal{L}(w_0)` pass) and broadcasts it.
        sampler: ``sampler(pl_module) -> None`` re-initializes the weights *in place*; default
            :func:`reset_all_parameters` (each submodule's ``reset_parameters``).
        loss_fn: ``loss_fn(pl_module, batch) -> scalar`` for a module without ``objective(batch)``.
        apply_to_any_optimizer: write :math:`\alpha` into every param group of every optimizer.

    Kept and checkpointed: ``lipschitz``, ``initial_loss``, ``total_steps``, ``lr``, ``sample_norms``;
    logged as ``lipschitz/L_hat``, ``lipschitz/initial_loss``, ``lipschitz/total_steps``, ``lipschitz/lr``.
    """

    def __init__(
        self,
        num_samples: int = 10,
        mode: Literal["full", "minibatch"] = "full",
        max_batches: int | None = None,
        seed: int | None = None,
        sampler: Sampler | None = None,
        loss_fn: LossFn | None = None,
        apply_to_any_optimizer: bool = False,
    ) -> None:
        super().__init__()
        check_estimate_settings(num_samples, mode, max_batches, seed)
        if sampler is not None and not callable(sampler):
            raise ValueError("sampler must be a callable sampler(pl_module) -> None that re-initializes in place.")
        if loss_fn is not None and not callable(loss_fn):
            raise ValueError("loss_fn must be a callable loss_fn(pl_module, batch) -> scalar tensor.")
        self.num_samples, self.mode, self.max_batches, self.seed = num_samples, mode, max_batches, seed
        self.sampler, self.loss_fn, self.apply_to_any_optimizer = sampler, loss_fn, apply_to_any_optimizer
        self.lipschitz: float | None = None
        self.initial_loss: float | None = None
        self.total_steps: int | None = None
        self.lr: float | None = None
        self.sample_norms: list[float] = []
        self._restored = False  # set by load_state_dict: the next fit keeps the checkpoint's lr

    @property
    def state_key(self) -> str:
        return self._generate_state_key(mode=self.mode, num_samples=self.num_samples, max_batches=self.max_batches)

    def state_dict(self) -> dict[str, Any]:
        return {"lipschitz": self.lipschitz, "initial_loss": self.initial_loss, "total_steps": self.total_steps,
                "lr": self.lr, "sample_norms": list(self.sample_norms)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.lipschitz, self.initial_loss = state_dict["lipschitz"], state_dict["initial_loss"]
        self.total_steps, self.lr = state_dict["total_steps"], state_dict["lr"]
        self.sample_norms = list(state_dict.get("sample_norms", []))
        self._restored = self.lr is not None

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self._restored:
            self._restored = False
            rank_zero_info(f"LipschitzEstimator: resumed from a checkpoint, keeping lr={self.lr} "
                           f"(L_hat={self.lipschitz}, L(w0)={self.initial_loss}, T={self.total_steps}).")
            return
        strategy, device, loader = trainer.strategy, trainer.strategy.root_device, trainer.train_dataloader
        loss_fn = self._loss_fn(pl_module)
        total_steps = trainer.estimated_stepping_batches
        if not (math.isfinite(total_steps) and total_steps >= 1):
            raise ValueError(
                f"LipschitzEstimator: alpha = sqrt(2 L(w0) / (L_hat T)) needs a finite T >= 1; the run has "
                f"T={total_steps} (infinite: max_steps=-1 and no max_epochs, or an infinite dataloader). "
                "Set max_steps or max_epochs on the Trainer."
            )
        total_steps = int(total_steps)
        if loader is None or isinstance(loader, (Mapping, list, tuple)):
            raise ValueError("LipschitzEstimator needs one training DataLoader; return one from train_dataloader().")
        params = [p for opt in trainer.optimizers for g in opt.param_groups for p in g["params"]]
        max_batches = self._batches_per_pass(trainer, loader)
        sampler = self.sampler if self.sampler is not None else _default_sampler(pl_module)

        def loss(batch: Any) -> Tensor:
            with trainer.precision_plugin.train_step_context():
                return loss_fn(pl_module, batch)

        def seed() -> int:
            if self.seed is not None:
                return self.seed
            return int(strategy.broadcast(int(torch.randint(0, 2**31 - 1, (1,)).item()), src=0))

        with isolate_rng(include_cuda=torch.cuda.is_initialized()):
            estimate = estimate_lipschitz(
                pl_module, loss, loader, sampler, lambda t: strategy.reduce(t, reduce_op="mean"), seed=seed,
                batch_size=_batch_size, prepare=lambda batch: strategy.batch_to_device(batch, device),
                num_samples=self.num_samples, mode=self.mode, max_batches=max_batches, params=params or None,
                device=device,
            )
        self.lipschitz, self.initial_loss, self.total_steps = estimate.lipschitz, estimate.initial_loss, total_steps
        self.sample_norms = estimate.sample_norms
        self.lr = constant_step_size(self.initial_loss, self.lipschitz, total_steps)
        self._apply_lr(trainer, self.lr)
        metrics = {"lipschitz/L_hat": self.lipschitz, "lipschitz/initial_loss": self.initial_loss,
                   "lipschitz/total_steps": float(total_steps), "lipschitz/lr": self.lr}
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=trainer.global_step)
        rank_zero_info(
            f"LipschitzEstimator ({self.mode}, N={self.num_samples}): L_hat={self.lipschitz:.6g}, "
            f"L(w0)={self.initial_loss:.6g}, T={total_steps}, alpha=sqrt(2 L(w0)/(L_hat T))={self.lr:.6g}"
        )

    def _loss_fn(self, pl_module: LightningModule) -> LossFn:
        if self.loss_fn is not None:
            return self.loss_fn
        if not callable(getattr(pl_module, "objective", None)):
            raise ValueError(
                f"LipschitzEstimator: {type(pl_module).__name__} has no objective(batch) method (the "
                "ConstrainedModule API); pass loss_fn=lambda module, batch: <scalar loss> to the callback."
            )
        return lambda module, batch: module.objective(as_task_sees_it(module, batch))

    def _batches_per_pass(self, trainer: Trainer, loader: Any) -> int | None:
        """The number of batches of a pass, the same on every rank (the minimum over ranks)."""
        try:
            count = float(len(loader))
        except TypeError:  # an iterable dataset
            count = math.inf
        count = min(count, float(self.max_batches or math.inf))
        if math.isinf(count):
            if trainer.world_size > 1:
                raise ValueError("LipschitzEstimator: the training dataloader has no length; under DDP pass "
                                 "max_batches so that every rank evaluates the same number of batches.")
            return None
        count_on_rank = torch.tensor(count, dtype=torch.float64, device=trainer.strategy.root_device)
        return int(trainer.strategy.reduce(count_on_rank, reduce_op="min"))  # 0: estimate_lipschitz says so

    def _apply_lr(self, trainer: Trainer, lr: float) -> None:
        written = 0
        for opt in trainer.optimizers:
            groups = [i for i, g in enumerate(opt.param_groups)
                      if self.apply_to_any_optimizer or isinstance(opt, ConstantStepAdam) or g["lr"] is None]
            if not groups:
                continue
            schedulers = [cfg.scheduler for cfg in trainer.lr_scheduler_configs if cfg.scheduler.optimizer is opt]
            written += len(set_lr(opt, lr, groups=groups, schedulers=schedulers))
            if schedulers:
                rank_zero_warn(f"LipschitzEstimator: {type(opt).__name__} has an LR scheduler; its base lr is now "
                               f"alpha={lr:.4g} and the schedule modulates it (the paper's step size is constant).")
        if written == 0:
            rank_zero_warn(
                f"LipschitzEstimator computed alpha={lr:.4g} but wrote it into no param group: none belongs to a "
                "ConstantStepAdam or has lr=None. Set apply_to_any_optimizer=True to use it with this optimizer."
            )


def _batch_size(batch: Any) -> float:
    try:
        return float(extract_batch_size(batch))
    except MisconfigurationException:  # no tensor in the batch
        return 1.0


def _default_sampler(pl_module: LightningModule) -> Sampler:
    missing = parameters_without_reset(pl_module)
    if missing:
        rank_zero_warn("LipschitzEstimator: these parameters have no reset_parameters() on their module and keep "
                       f"their current values in every weight sample: {missing}. Pass sampler=... to re-draw them too.")
    return reset_all_parameters

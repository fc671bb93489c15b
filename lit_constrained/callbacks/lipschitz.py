"""Estimate the loss's Lipschitz constant at fit start and set Adam's "exact" constant step size.

Tian et al. (arXiv 2309.08339) run Adam (their Algorithm 1, :class:`~lit_constrained.optim.ConstantStepAdam`)
with the constant step size

.. math::

    \\alpha = \\sqrt{\\frac{2 \\mathcal{L}(w_0)}{\\hat L \\, T}},

where :math:`\\mathcal{L}(w_0)` is the loss at the initial weights, :math:`T` the number of iterations
of the run and :math:`\\hat L` an estimate of the Lipschitz constant of the loss (their Algorithms 2
and 3): the largest gradient norm seen over :math:`N` weight vectors drawn from the model's own
initialization distribution.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Literal

import numpy as np
import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.utilities.rank_zero import rank_zero_info, rank_zero_warn
from torch import Tensor

from lit_constrained.optim.constant_step_adam import ConstantStepAdam
from lit_constrained.batch import as_task_sees_it
from lit_constrained.optim.flat import gather

__all__ = ["LipschitzEstimator", "reset_all_parameters"]

LossFn = Callable[[LightningModule, Any], Tensor]
Sampler = Callable[[LightningModule], None]


def reset_all_parameters(module: torch.nn.Module) -> None:
    """Draw fresh weights from the model's own initialization: every submodule's ``reset_parameters``."""
    for sub in module.modules():
        reset = getattr(sub, "reset_parameters", None)
        if callable(reset):
            reset()


def _params_without_reset(module: torch.nn.Module) -> list[str]:
    """Names of the trainable parameters that :func:`reset_all_parameters` does not re-draw."""
    missing = []
    for name, sub in module.named_modules():
        if callable(getattr(sub, "reset_parameters", None)):
            continue
        for pname, p in sub.named_parameters(recurse=False):
            if p.requires_grad:
                missing.append(f"{name}.{pname}" if name else pname)
    return missing


def _batch_weight(batch: Any) -> float:
    """The size of the first dimension of the first tensor found in ``batch`` (1 if there is none)."""
    if isinstance(batch, Tensor):
        return float(batch.shape[0]) if batch.ndim > 0 else 1.0
    if isinstance(batch, Mapping):
        items: Iterable[Any] = batch.values()
    elif isinstance(batch, (list, tuple)):
        items = batch
    else:
        return 1.0
    for item in items:
        if isinstance(item, (Tensor, Mapping, list, tuple)):
            return _batch_weight(item)
    return 1.0


def _rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": np.random.get_state(),
        "python": random.getstate(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if "cuda" in state:
        torch.cuda.set_rng_state_all(state["cuda"])


def _seed_all(seed: int) -> None:
    torch.default_generator.manual_seed(seed)
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.manual_seed_all(seed)
    np.random.seed(seed % 2**32)
    random.seed(seed)


class LipschitzEstimator(Callback):
    r"""Set the constant step size :math:`\alpha = \sqrt{2 \mathcal{L}(w_0) / (\hat L T)}` at fit start.

    In ``on_train_start`` (after the optimizers exist, before the first step) it computes

    - :math:`\mathcal{L}(w_0)`, the *full objective* at the initial weights: the mean over the training
      batches (one pass, at most ``max_batches`` of them) of ``objective(batch)``, weighted by the
      batch sizes (the first dimension of the first tensor in each batch; equal sizes give the plain
      mean). Under DDP the weighted mean runs over the batches of all ranks.
    - :math:`\hat L` by the paper's Algorithm 2 (``mode="full"``): for :math:`n = 1..N` draw weights
      :math:`w_n` and take :math:`\hat L = \max_n \|\nabla \mathcal{L}(w_n)\|_2`, the gradient of the
      full objective above; or by Algorithm 3 (``mode="minibatch"``):
      :math:`\hat L = \max_n \max_j \|\nabla \mathcal{L}^j(w_n)\|_2` over one pass of the training batches
      :math:`j` (under DDP :math:`\mathcal{L}^j` is the objective of the global batch, i.e. the gradient
      averaged over ranks, weighted by the per-rank batch sizes).
    - :math:`T` = ``trainer.estimated_stepping_batches`` (one optimizer step per training batch, as in
      ``ConstrainedModule``'s training step).

    The loss is ``objective(batch)`` alone: a ``ConstrainedModule``'s constraints and its optional
    penalty term are not part of it.

    Honest caveat (also in :class:`~lit_constrained.optim.ConstantStepAdam`): the paper's theorems use
    a *smoothness* constant :math:`K` (Lipschitz constant of the gradient), while Algorithms 2/3 estimate
    a bound on the *gradient norm*, i.e. the Lipschitz constant of the loss itself. This callback follows
    the algorithms, so :math:`\hat L` is a (sampled, hence lower) estimate of :math:`\sup_w \|\nabla
    \mathcal{L}(w)\|` over the initialization distribution, not of :math:`K`.

    Gradients are taken with ``torch.autograd.grad`` with respect to the optimizers' parameters (their
    ``param_groups`` order), so ``.grad``, DDP hooks and ``on_after_backward`` are not touched. The
    weights and buffers of the model, the optimizer state and the RNG states (torch CPU, CUDA when
    initialized, numpy, python ``random``) are restored exactly afterwards; only the ``lr`` of the
    selected param groups changes.

    Which param groups receive :math:`\alpha`: every group of a ``ConstantStepAdam`` and every group
    (of any optimizer) whose ``lr`` is ``None``; with ``apply_to_any_optimizer=True``, every group of
    every optimizer (e.g. ``SQPAdam``). When an LR scheduler drives such an optimizer, its base lr
    becomes :math:`\alpha` and the current lr is rescaled by the same factor (with a warning: the
    paper's step is constant). Nothing written gives a warning.

    Resuming from a checkpoint restores the numbers (``state_dict``) and the optimizers' ``lr``, and the
    estimation is not run again.

    Args:
        num_samples: :math:`N`, the number of weight samples.
        mode: ``"full"`` (Algorithm 2) or ``"minibatch"`` (Algorithm 3).
        max_batches: use only the first ``max_batches`` training batches of each pass (``None``: all).
        seed: seed of the weight draws (the same on every rank): :math:`w_1, \dots, w_N` are the results
            of ``N`` calls of the sampler in a row right after seeding torch / numpy / ``random`` with it
            (the data passes in between run on a separate stream seeded with ``seed + 1``). ``None`` draws
            a seed from torch's RNG on rank 0 and broadcasts it. The global RNG states are restored either way.
        sampler: ``sampler(pl_module) -> None`` re-initializes the weights *in place*; default
            :func:`reset_all_parameters` (each submodule's ``reset_parameters``).
        loss_fn: ``loss_fn(pl_module, batch) -> scalar`` for a module without an ``objective(batch)``
            method; default ``pl_module.objective(batch)``.
        apply_to_any_optimizer: write :math:`\alpha` into every param group of every optimizer.

    After the estimation the numbers are kept as ``lipschitz`` (:math:`\hat L`), ``initial_loss``
    (:math:`\mathcal{L}(w_0)`), ``total_steps`` (:math:`T`), ``lr`` (:math:`\alpha`) and
    ``sample_norms`` (the gradient-norm statistic of each sample); they are logged to the loggers
    (``lipschitz/L_hat``, ``lipschitz/initial_loss``, ``lipschitz/total_steps``, ``lipschitz/lr``) and
    to the console.
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
        if isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 1:
            raise ValueError(f"Invalid num_samples={num_samples!r}: it must be an integer >= 1.")
        if mode not in ("full", "minibatch"):
            raise ValueError(f"Invalid mode={mode!r}: use 'full' (Algorithm 2) or 'minibatch' (Algorithm 3).")
        if max_batches is not None and (
            isinstance(max_batches, bool) or not isinstance(max_batches, int) or max_batches < 1
        ):
            raise ValueError(f"Invalid max_batches={max_batches!r}: it must be None or an integer >= 1.")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise ValueError(f"Invalid seed={seed!r}: it must be None or an integer.")
        if sampler is not None and not callable(sampler):
            raise ValueError("sampler must be a callable sampler(pl_module) -> None that re-initializes in place.")
        if loss_fn is not None and not callable(loss_fn):
            raise ValueError("loss_fn must be a callable loss_fn(pl_module, batch) -> scalar tensor.")
        self.num_samples = num_samples
        self.mode = mode
        self.max_batches = max_batches
        self.seed = seed
        self.sampler = sampler
        self.loss_fn = loss_fn
        self.apply_to_any_optimizer = apply_to_any_optimizer
        self.lipschitz: float | None = None
        self.initial_loss: float | None = None
        self.total_steps: int | None = None
        self.lr: float | None = None
        self.sample_norms: list[float] = []
        self._restored = False

    # ------------------------------------------------------------------ Lightning hooks

    @property
    def state_key(self) -> str:
        return self._generate_state_key(mode=self.mode, num_samples=self.num_samples, max_batches=self.max_batches)

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self._restored:
            self._restored = False
            rank_zero_info(
                f"LipschitzEstimator: resumed from a checkpoint, keeping lr={self.lr} "
                f"(L_hat={self.lipschitz}, L(w0)={self.initial_loss}, T={self.total_steps})."
            )
            return
        loss_fn = self._resolve_loss_fn(pl_module)
        total_steps = self._total_steps(trainer)
        params = self._trainable_params(trainer, pl_module)
        dataloader = self._dataloader(trainer)
        n_batches = self._num_batches(trainer, dataloader)

        snapshot = [(t, t.detach().clone()) for t in self._tensors_to_restore(trainer, pl_module)]
        rng = _rng_state()
        try:
            initial_loss, _ = self._pass(trainer, pl_module, loss_fn, dataloader, n_batches, params, grads=False)
            if not (math.isfinite(initial_loss) and initial_loss > 0):
                raise ValueError(
                    f"LipschitzEstimator: the initial loss L(w0)={initial_loss} is not a positive finite number; "
                    "alpha = sqrt(2 L(w0) / (L_hat T)) needs L(w0) > 0 (the paper assumes a final loss of 0). "
                    "Use a non-negative objective that is not already 0, or set the lr yourself."
                )
            seed = self.seed
            if seed is None:
                seed = int(torch.randint(0, 2**31 - 1, (1,)).item())
                seed = int(trainer.strategy.broadcast(seed, src=0))
            # two RNG streams: the weight draws (seeded with `seed`) and the data passes (seed + 1), so that
            # w_1..w_N are exactly what the sampler draws in a row after seeding, whatever the passes consume
            _seed_all(seed)
            sample_rng = _rng_state()
            _seed_all(seed + 1)
            pass_rng = _rng_state()
            sampler = self.sampler if self.sampler is not None else self._default_sampler(pl_module)
            ids = [id(p) for p in pl_module.parameters()]
            norms = []
            for _ in range(self.num_samples):
                _set_rng_state(sample_rng)
                sampler(pl_module)
                sample_rng = _rng_state()
                if [id(p) for p in pl_module.parameters()] != ids:
                    raise ValueError(
                        "LipschitzEstimator: the sampler replaced Parameter objects; it must re-initialize the "
                        "weights in place (e.g. with torch.nn.init functions or p.data.copy_)."
                    )
                _set_rng_state(pass_rng)
                _, norm = self._pass(trainer, pl_module, loss_fn, dataloader, n_batches, params, grads=True)
                pass_rng = _rng_state()
                norms.append(norm)
        finally:
            with torch.no_grad():
                for t, saved in snapshot:
                    t.copy_(saved)
            _set_rng_state(rng)

        lipschitz = max(norms)
        if not (math.isfinite(lipschitz) and lipschitz > 0):
            raise ValueError(
                f"LipschitzEstimator: the estimated Lipschitz constant L_hat={lipschitz} is not a positive finite "
                "number (all sampled gradients are zero or non-finite), so alpha = sqrt(2 L(w0) / (L_hat T)) is "
                "undefined. Check that the objective depends on the trainable parameters and that the sampler "
                "draws weights with a non-zero gradient."
            )
        self.lipschitz = lipschitz
        self.initial_loss = initial_loss
        self.total_steps = total_steps
        self.sample_norms = norms
        self.lr = math.sqrt(2.0 * initial_loss / (lipschitz * total_steps))
        self._apply_lr(trainer, self.lr)
        self._log(trainer)

    def state_dict(self) -> dict[str, Any]:
        return {
            "lipschitz": self.lipschitz,
            "initial_loss": self.initial_loss,
            "total_steps": self.total_steps,
            "lr": self.lr,
            "sample_norms": list(self.sample_norms),
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.lipschitz = state_dict["lipschitz"]
        self.initial_loss = state_dict["initial_loss"]
        self.total_steps = state_dict["total_steps"]
        self.lr = state_dict["lr"]
        self.sample_norms = list(state_dict.get("sample_norms", []))
        self._restored = self.lr is not None

    # ------------------------------------------------------------------ set-up checks

    def _resolve_loss_fn(self, pl_module: LightningModule) -> LossFn:
        if self.loss_fn is not None:
            return self.loss_fn
        objective = getattr(pl_module, "objective", None)
        if not callable(objective):
            raise ValueError(
                f"LipschitzEstimator: {type(pl_module).__name__} has no objective(batch) method (the "
                "ConstrainedModule API); pass loss_fn=lambda module, batch: <scalar loss> to the callback."
            )
        return lambda module, batch: module.objective(as_task_sees_it(module, batch))

    @staticmethod
    def _total_steps(trainer: Trainer) -> int:
        total = trainer.estimated_stepping_batches
        if not math.isfinite(total):
            raise ValueError(
                "LipschitzEstimator: the total number of steps T is infinite (max_steps=-1 and no max_epochs, "
                "or an infinite dataloader), but alpha = sqrt(2 L(w0) / (L_hat T)) needs a finite T. "
                "Set max_steps or max_epochs on the Trainer."
            )
        total = int(total)
        if total < 1:
            raise ValueError(f"LipschitzEstimator: the run has T={total} steps; alpha needs T >= 1.")
        return total

    @staticmethod
    def _trainable_params(trainer: Trainer, pl_module: LightningModule) -> list[Tensor]:
        seen: set[int] = set()
        params: list[Tensor] = []
        sources: Iterable[Tensor] = [p for opt in trainer.optimizers for g in opt.param_groups for p in g["params"]]
        if not trainer.optimizers:
            sources = pl_module.parameters()
        for p in sources:
            if p.requires_grad and id(p) not in seen:
                seen.add(id(p))
                params.append(p)
        if not params:
            raise ValueError("LipschitzEstimator: there are no trainable parameters to estimate a gradient norm on.")
        return params

    @staticmethod
    def _dataloader(trainer: Trainer) -> Iterable[Any]:
        loader = trainer.train_dataloader
        if loader is None:
            raise ValueError("LipschitzEstimator: the trainer has no training dataloader.")
        if isinstance(loader, (Mapping, list, tuple)):
            raise ValueError(
                "LipschitzEstimator supports a single training dataloader; got a collection of "
                f"{len(loader)}. Return one DataLoader from train_dataloader()."
            )
        return loader

    def _num_batches(self, trainer: Trainer, dataloader: Iterable[Any]) -> int | None:
        """The number of batches of a pass, the same on every rank (the minimum over ranks)."""
        try:
            count: float = float(len(dataloader))  # type: ignore[arg-type]
        except TypeError:
            count = math.inf
        if self.max_batches is not None:
            count = min(count, float(self.max_batches))
        if math.isinf(count):
            if trainer.world_size > 1:
                raise ValueError(
                    "LipschitzEstimator: the training dataloader has no length; under DDP pass max_batches so "
                    "that every rank evaluates the same number of batches."
                )
            return None
        reduced = trainer.strategy.reduce(torch.tensor(count, dtype=torch.float64, device=trainer.strategy.root_device),
                                          reduce_op="min")
        count = float(reduced)
        if count < 1:
            raise ValueError("LipschitzEstimator: the training dataloader is empty.")
        return int(count)

    @staticmethod
    def _tensors_to_restore(trainer: Trainer, pl_module: LightningModule) -> list[Tensor]:
        seen: set[int] = set()
        tensors: list[Tensor] = []
        extra = [p for opt in trainer.optimizers for g in opt.param_groups for p in g["params"]]
        for t in [*pl_module.parameters(), *pl_module.buffers(), *extra]:
            if id(t) not in seen:
                seen.add(id(t))
                tensors.append(t)
        return tensors

    @staticmethod
    def _default_sampler(pl_module: LightningModule) -> Sampler:
        missing = _params_without_reset(pl_module)
        if missing:
            rank_zero_warn(
                "LipschitzEstimator: these parameters have no reset_parameters() on their module and keep their "
                f"current values in every weight sample: {missing}. Pass sampler=... to re-draw them too."
            )
        return reset_all_parameters

    # ------------------------------------------------------------------ the estimation

    def _pass(
        self,
        trainer: Trainer,
        pl_module: LightningModule,
        loss_fn: LossFn,
        dataloader: Iterable[Any],
        n_batches: int | None,
        params: Sequence[Tensor],
        grads: bool,
    ) -> tuple[float, float]:
        """One pass over the batches: (full objective, gradient-norm statistic of the mode).

        The statistic is ||grad of the weighted-mean objective|| for ``mode="full"`` and the largest
        per-batch gradient norm for ``mode="minibatch"`` (0 when ``grads`` is False). Every batch is
        reduced over ranks as one buffer [b_j grad_j, b_j f_j, b_j] (mean), whose ratios are the
        weighted means over the global batch.
        """
        strategy = trainer.strategy
        device = strategy.root_device
        dtype = torch.float64
        n = sum(p.numel() * (2 if p.is_complex() else 1) for p in params) if grads else 0
        acc = torch.zeros(n + 2, dtype=dtype, device=device)  # [sum b g, sum b f, sum b]
        local = torch.zeros(2, dtype=dtype, device=device)  # minibatch mode: [sum b f, sum b], reduced at the end
        best = 0.0
        seen = 0
        for batch in dataloader:
            if n_batches is not None and seen >= n_batches:
                break
            seen += 1
            batch = strategy.batch_to_device(batch, device)
            weight = _batch_weight(batch)
            with torch.enable_grad(), trainer.precision_plugin.train_step_context():
                loss = loss_fn(pl_module, batch)
            if not isinstance(loss, Tensor) or loss.numel() != 1:
                raise ValueError(
                    "LipschitzEstimator: the objective must return a scalar tensor; got "
                    f"{type(loss).__name__}{tuple(loss.shape) if isinstance(loss, Tensor) else ''}."
                )
            buf = torch.zeros(n + 2, dtype=dtype, device=device)
            buf[n] = weight * loss.detach().to(dtype).reshape(())
            buf[n + 1] = weight
            if grads:
                if not loss.requires_grad:
                    raise ValueError(
                        "LipschitzEstimator: the objective does not depend on the trainable parameters "
                        "(its value has no grad_fn), so its gradient norm is 0."
                    )
                g = torch.autograd.grad(loss.reshape(()), list(params), allow_unused=True)
                buf[:n] = weight * gather(list(g), params, dtype).to(device)
            if self.mode == "minibatch" and grads:
                local += buf[n:]
                buf = strategy.reduce(buf.clone(), reduce_op="mean")
                best = max(best, float(torch.linalg.vector_norm(buf[:n]) / buf[n + 1]))
            else:
                acc += buf
        if seen == 0:
            raise ValueError("LipschitzEstimator: the training dataloader yielded no batch.")
        if self.mode == "minibatch" and grads:
            totals = strategy.reduce(local.clone(), reduce_op="mean")
            return float(totals[0] / totals[1]), best
        acc = strategy.reduce(acc.clone(), reduce_op="mean")
        full_loss = float(acc[n] / acc[n + 1])
        norm = float(torch.linalg.vector_norm(acc[:n]) / acc[n + 1]) if grads else 0.0
        return full_loss, norm

    # ------------------------------------------------------------------ output

    def _apply_lr(self, trainer: Trainer, lr: float) -> None:
        written = 0
        for opt in trainer.optimizers:
            chosen = [
                self.apply_to_any_optimizer or isinstance(opt, ConstantStepAdam) or group["lr"] is None
                for group in opt.param_groups
            ]
            if not any(chosen):
                continue
            schedulers = [cfg.scheduler for cfg in trainer.lr_scheduler_configs if cfg.scheduler.optimizer is opt]
            for i, (group, pick) in enumerate(zip(opt.param_groups, chosen)):
                if not pick:
                    continue
                factor = 1.0
                for sched in schedulers:
                    base_lrs = getattr(sched, "base_lrs", None)
                    if base_lrs is not None and i < len(base_lrs):
                        if base_lrs[i] and group["lr"] is not None:
                            factor = float(group["lr"]) / float(base_lrs[i])
                        base_lrs[i] = lr
                if "initial_lr" in group:
                    group["initial_lr"] = lr
                group["lr"] = lr * factor
                written += 1
            if schedulers:
                rank_zero_warn(
                    f"LipschitzEstimator: {type(opt).__name__} has an LR scheduler; its base lr is now alpha={lr:.4g} "
                    "and the schedule modulates it (the paper's step size is constant)."
                )
        if written == 0:
            rank_zero_warn(
                f"LipschitzEstimator computed alpha={lr:.4g} but wrote it into no param group: none belongs to a "
                "ConstantStepAdam or has lr=None. Set apply_to_any_optimizer=True to use it with this optimizer."
            )

    def _log(self, trainer: Trainer) -> None:
        metrics = {
            "lipschitz/L_hat": float(self.lipschitz),  # type: ignore[arg-type]
            "lipschitz/initial_loss": float(self.initial_loss),  # type: ignore[arg-type]
            "lipschitz/total_steps": float(self.total_steps),  # type: ignore[arg-type]
            "lipschitz/lr": float(self.lr),  # type: ignore[arg-type]
        }
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=trainer.global_step)
        rank_zero_info(
            f"LipschitzEstimator ({self.mode}, N={self.num_samples}): L_hat={self.lipschitz:.6g}, "
            f"L(w0)={self.initial_loss:.6g}, T={self.total_steps}, alpha=sqrt(2 L(w0)/(L_hat T))={self.lr:.6g}"
        )

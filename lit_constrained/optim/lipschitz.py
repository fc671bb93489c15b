r"""The Lipschitz estimate of a loss and the "exact" constant step size of Adam it gives.

Tian et al. (arXiv 2309.08339) run Adam (their Algorithm 1, :class:`~lit_constrained.optim.ConstantStepAdam`)
with the constant step size

.. math::

    \alpha = \sqrt{\frac{2 \mathcal{L}(w_0)}{\hat L \, T}}
    \qquad (:func:`constant_step_size`),

where :math:`\mathcal{L}(w_0)` is the loss at the initial weights, :math:`T` the number of iterations
of the run and :math:`\hat L` an estimate of the Lipschitz constant of the loss (their Algorithms 2
and 3, :func:`estimate_lipschitz`): the largest gradient norm seen over :math:`N` weight vectors
drawn from the model's own initialization distribution.

Plain PyTorch: a data-parallel run passes its ``reduce`` (a mean over ranks); the Lightning glue
(which batches, which device, which seed, where the lr goes) is
:class:`lit_constrained.callbacks.LipschitzEstimator`.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch
from torch import Tensor, nn

from lit_constrained.jacobians import block_sizes

from .flat import gather

__all__ = [
    "LipschitzEstimate", "check_estimate_settings", "constant_step_size", "estimate_lipschitz",
    "parameters_without_reset", "reset_all_parameters",
]

Loss = Callable[[Any], Tensor]
Sampler = Callable[[nn.Module], None]
Reduce = Callable[[Tensor], Tensor]


def reset_all_parameters(module: nn.Module) -> None:
    """Draw fresh weights from the model's own initialization: every submodule's ``reset_parameters``."""
    for sub in module.modules():
        reset = getattr(sub, "reset_parameters", None)
        if callable(reset):
            reset()


def parameters_without_reset(module: nn.Module) -> list[str]:
    """Names of the trainable parameters that :func:`reset_all_parameters` does not re-draw (their
    module has no ``reset_parameters``): they keep their values in every weight sample."""
    missing = []
    for name, sub in module.named_modules():
        if callable(getattr(sub, "reset_parameters", None)):
            continue
        for pname, p in sub.named_parameters(recurse=False):
            if p.requires_grad:
                missing.append(f"{name}.{pname}" if name else pname)
    return missing


@dataclass(frozen=True)
class LipschitzEstimate:
    r"""What :func:`estimate_lipschitz` measured.

    Attributes:
        lipschitz: :math:`\hat L = \max_n s_n`.
        initial_loss: :math:`\mathcal{L}(w_0)`, the full objective at the weights the model had.
        sample_norms: :math:`s_1, \dots, s_N`, the gradient-norm statistic of each weight sample.
    """

    lipschitz: float
    initial_loss: float
    sample_norms: list[float]


def constant_step_size(initial_loss: float, lipschitz: float, total_steps: int) -> float:
    r""":math:`\alpha = \sqrt{2 \mathcal{L}(w_0) / (\hat L T)}`, the paper's constant step (its simplification
    of the theorem: final loss 0, :math:`\delta^2` dropped)."""
    if not (math.isfinite(initial_loss) and initial_loss > 0):
        raise ValueError(f"constant_step_size: L(w0)={initial_loss} must be a positive finite number.")
    if not (math.isfinite(lipschitz) and lipschitz > 0):
        raise ValueError(f"constant_step_size: L_hat={lipschitz} must be a positive finite number.")
    if total_steps < 1:
        raise ValueError(f"constant_step_size: the run has T={total_steps} steps; alpha needs T >= 1.")
    return math.sqrt(2.0 * initial_loss / (lipschitz * total_steps))


def check_estimate_settings(num_samples: int, mode: str, max_batches: int | None, seed: int | None) -> None:
    """Raise a ``ValueError`` naming the first of :func:`estimate_lipschitz`'s settings that is invalid."""

    def is_int(value: Any) -> bool:
        return isinstance(value, int) and not isinstance(value, bool)

    if not is_int(num_samples) or num_samples < 1:
        raise ValueError(f"Invalid num_samples={num_samples!r}: it must be an integer >= 1.")
    if mode not in ("full", "minibatch"):
        raise ValueError(f"Invalid mode={mode!r}: use 'full' (Algorithm 2) or 'minibatch' (Algorithm 3).")
    if max_batches is not None and (not is_int(max_batches) or max_batches < 1):
        raise ValueError(f"Invalid max_batches={max_batches!r}: it must be None or an integer >= 1.")
    if seed is not None and not is_int(seed):
        raise ValueError(f"Invalid seed={seed!r}: it must be None or an integer.")


def estimate_lipschitz(
    model: nn.Module,
    loss: Loss,
    batches: Iterable[Any],
    sampler: Sampler = reset_all_parameters,
    reduce: Reduce | None = None,
    *,
    seed: int | Callable[[], int],
    batch_size: Callable[[Any], float],
    prepare: Callable[[Any], Any] | None = None,
    num_samples: int = 10,
    mode: Literal["full", "minibatch"] = "full",
    max_batches: int | None = None,
    params: Sequence[Tensor] | None = None,
    device: torch.device | str | None = None,
) -> LipschitzEstimate:
    r"""Estimate :math:`\mathcal{L}(w_0)` and the Lipschitz constant :math:`\hat L` of the loss (Algorithms 2/3).

    With :math:`b_j` the size of batch :math:`j` and :math:`f_j(w)` = ``loss(batch_j)`` at weights
    :math:`w`, one pass over ``batches`` (at most ``max_batches`` of them) gives the full objective

    .. math::

        \mathcal{L}(w) = \frac{\sum_j b_j f_j(w)}{\sum_j b_j}

    (equal sizes give the plain mean). Then :math:`\mathcal{L}(w_0)` is it at the model's current
    weights, and for :math:`n = 1..N` the ``sampler`` draws weights :math:`w_n` in place and

    - ``mode="full"`` (Algorithm 2): :math:`s_n = \|\nabla \mathcal{L}(w_n)\|_2`;
    - ``mode="minibatch"`` (Algorithm 3): :math:`s_n = \max_j \|\nabla f_j(w_n)\|_2`;

    and :math:`\hat L = \max_n s_n`. Under data parallelism ``reduce`` (the mean over ranks) makes
    every sum run over the batches of all ranks: each batch contributes the buffer
    :math:`[b_j \nabla f_j, b_j f_j, b_j]`, whose reduced ratios are weighted means. In full mode the
    buffer of the whole pass is reduced once; in minibatch mode batch :math:`j` is the global batch
    (the :math:`j`-th batch of every rank) and its buffer is reduced on its own, so every rank must
    see the same number of batches.

    Caveat (also in :class:`~lit_constrained.optim.ConstantStepAdam`): the paper's theorems use a
    *smoothness* constant :math:`K` (the Lipschitz constant of the gradient), while Algorithms 2/3
    estimate a bound on the *gradient norm*, i.e. the Lipschitz constant of the loss itself. This
    follows the algorithms: :math:`\hat L` is a sampled (hence lower) estimate of
    :math:`\sup_w \|\nabla \mathcal{L}(w)\|` over the initialization distribution, not of :math:`K`.

    Gradients are taken with ``torch.autograd.grad`` with respect to ``params``, so ``.grad`` and
    backward hooks are not touched. The model's parameters and buffers and ``params`` are put back
    exactly afterwards (also on error).

    Randomness: the :math:`\mathcal{L}(w_0)` pass runs on the global RNGs as the caller left them.
    Then two streams of the global RNGs (torch CPU, CUDA when initialized, numpy, python
    ``random``) take turns: :math:`w_1, \dots, w_N` are the results of :math:`N` sampler calls in a
    row right after seeding all of them with ``seed``, and the gradient passes in between continue a
    stream seeded with ``seed + 1``, so what the passes consume (dropout, shuffling) does not move
    the draws. The global RNGs are left re-seeded: wrap the call in ``torch.random.fork_rng`` or
    Lightning's ``isolate_rng`` to keep the caller's streams. The generators ``batches`` owns (a
    ``DataLoader``'s ``generator``, those of its sampler and batch sampler) are put back where they
    were, and so is the state of a loader with ``state_dict`` / ``load_state_dict``: iterating after
    the estimate gives the batches it would have given without it.

    Args:
        model: the module whose weights the sampler re-draws.
        loss: ``loss(batch) -> scalar tensor``, differentiable in ``params`` (evaluated with grad on).
        batches: an iterable that can be iterated once per pass (a ``DataLoader``), the same batches in
            each pass up to the order a shuffling loader gives.
        sampler: ``sampler(model) -> None`` re-initializes the weights in place (it must keep the
            ``Parameter`` objects); default :func:`reset_all_parameters`.
        reduce: the mean over ranks of a float64 tensor (``None``: one process).
        seed: seed of the weight draws (the same on every rank), or a function returning it, called
            once after the :math:`\mathcal{L}(w_0)` pass.
        batch_size: ``batch_size(batch) -> b_j``, the weight of a (prepared) batch.
        prepare: applied to each batch first (e.g. the move to the device); ``None``: none.
        num_samples: :math:`N`.
        mode: ``"full"`` (Algorithm 2) or ``"minibatch"`` (Algorithm 3).
        max_batches: use only the first ``max_batches`` batches of each pass (``None``: all).
        params: the tensors to differentiate (default: the model's parameters that require grad).
        device: where the reduced buffers live (default: the device of the first of ``params``).

    Raises:
        ValueError: :math:`\mathcal{L}(w_0)` or :math:`\hat L` not a positive finite number (the
            step :func:`constant_step_size` would be undefined), a sampler that replaced
            ``Parameter`` objects, a loss that is not a scalar or does not depend on ``params``, no
            batch.
    """
    if seed is None:
        raise ValueError("estimate_lipschitz: seed must be an integer or a function returning one, not None.")
    check_estimate_settings(num_samples, mode, max_batches, None if callable(seed) else seed)
    params = _unique(p for p in (model.parameters() if params is None else params) if p.requires_grad)
    if not params:
        raise ValueError("estimate_lipschitz: there are no trainable parameters to estimate a gradient norm on.")
    device = torch.device(device or params[0].device)
    pass_ = _Pass(loss, batches, prepare, params, batch_size, reduce, max_batches, device)
    weights = _unique(itertools.chain(model.parameters(), model.buffers(), params))
    with _tensors_put_back(weights), _loader_left_as_found(batches):
        initial_loss, _ = pass_.run(grads=False, minibatch=False)
        if not (math.isfinite(initial_loss) and initial_loss > 0):
            raise ValueError(
                f"estimate_lipschitz: the initial loss L(w0)={initial_loss} is not a positive finite number; "
                "alpha = sqrt(2 L(w0) / (L_hat T)) needs L(w0) > 0 (the paper assumes a final loss of 0). "
                "Use a non-negative objective that is not already 0, or set the lr yourself."
            )
        start = int(seed() if callable(seed) else seed)
        draws, passes = _RNGStream(start), _RNGStream(start + 1)
        ids = [id(p) for p in model.parameters()]
        norms = []
        for _ in range(num_samples):
            with draws:
                sampler(model)
            if [id(p) for p in model.parameters()] != ids:
                raise ValueError(
                    "estimate_lipschitz: the sampler replaced Parameter objects; it must re-initialize the "
                    "weights in place (e.g. with torch.nn.init functions or p.data.copy_)."
                )
            with passes:
                norms.append(pass_.run(grads=True, minibatch=mode == "minibatch")[1])
    lipschitz = max(norms)
    if not (math.isfinite(lipschitz) and lipschitz > 0):
        raise ValueError(
            f"estimate_lipschitz: the estimated Lipschitz constant L_hat={lipschitz} is not a positive finite "
            "number (all sampled gradients are zero or non-finite), so alpha = sqrt(2 L(w0) / (L_hat T)) is "
            "undefined. Check that the objective depends on the trainable parameters and that the sampler "
            "draws weights with a non-zero gradient."
        )
    return LipschitzEstimate(lipschitz=lipschitz, initial_loss=initial_loss, sample_norms=norms)


@dataclass
class _Pass:
    """One pass over the batches, as :func:`estimate_lipschitz` describes it."""

    loss: Loss
    batches: Iterable[Any]
    prepare: Callable[[Any], Any] | None
    params: list[Tensor]
    batch_size: Callable[[Any], float]
    reduce: Reduce | None
    max_batches: int | None
    device: torch.device

    def run(self, grads: bool, minibatch: bool) -> tuple[float, float]:
        """(full objective, gradient-norm statistic): :math:`\\|\\nabla \\mathcal{L}\\|` over the pass, or with
        ``minibatch`` the largest per-batch gradient norm (0 without ``grads``)."""
        dtype = torch.float64
        n = sum(block_sizes(self.params)) if grads else 0
        acc = torch.zeros(n + 2, dtype=dtype, device=self.device)  # [sum b g, sum b f, sum b]
        best, seen = 0.0, 0
        for batch in itertools.islice(self.batches, self.max_batches):
            seen += 1
            if self.prepare is not None:
                batch = self.prepare(batch)
            weight = float(self.batch_size(batch))
            with torch.enable_grad():
                value = self.loss(batch)
            if not isinstance(value, Tensor) or value.numel() != 1:
                raise ValueError(
                    "estimate_lipschitz: the loss must return a scalar tensor; got "
                    f"{type(value).__name__}{tuple(value.shape) if isinstance(value, Tensor) else ''}."
                )
            buf = torch.zeros(n + 2, dtype=dtype, device=self.device)
            buf[n] = weight * value.detach().to(dtype).reshape(())
            buf[n + 1] = weight
            if grads:
                if not value.requires_grad:
                    raise ValueError(
                        "estimate_lipschitz: the objective does not depend on the trainable parameters "
                        "(its value has no grad_fn), so its gradient norm is 0."
                    )
                g = torch.autograd.grad(value.reshape(()), self.params, allow_unused=True)
                buf[:n] = weight * gather(list(g), self.params, dtype).to(self.device)
            if minibatch:  # the global batch j: its own reduced buffer
                global_batch = self._reduced(buf)
                best = max(best, float(torch.linalg.vector_norm(global_batch[:n]) / global_batch[n + 1]))
                acc[n:] += buf[n:]
            else:
                acc += buf
        if seen == 0:
            raise ValueError("estimate_lipschitz: the batches yielded no batch.")
        if minibatch:
            totals = self._reduced(acc[n:])
            return float(totals[0] / totals[1]), best
        acc = self._reduced(acc)
        norm = float(torch.linalg.vector_norm(acc[:n]) / acc[n + 1]) if grads else 0.0
        return float(acc[n] / acc[n + 1]), norm

    def _reduced(self, buf: Tensor) -> Tensor:
        return buf if self.reduce is None else self.reduce(buf.clone())


@contextmanager
def _tensors_put_back(tensors: Sequence[Tensor]) -> Iterator[None]:
    """Restore the values of ``tensors`` on exit (also on error)."""
    saved = [t.detach().clone() for t in tensors]
    try:
        yield
    finally:
        with torch.no_grad():
            for t, value in zip(tensors, saved):
                t.copy_(value)


@contextmanager
def _loader_left_as_found(loader: Any) -> Iterator[None]:
    """Restore on exit the generators a loader, its sampler and its batch sampler own, and the state of
    a stateful loader (``state_dict`` / ``load_state_dict``), so the passes do not move them."""
    batch_sampler = getattr(loader, "batch_sampler", None)
    owners = (loader, getattr(loader, "sampler", None), batch_sampler, getattr(batch_sampler, "sampler", None))
    found = (v for owner in owners for v in getattr(owner, "__dict__", {}).values())
    generators = {id(v): v for v in found if isinstance(v, torch.Generator)}
    saved = [(g, g.get_state()) for g in generators.values()]
    stateful = callable(getattr(loader, "state_dict", None)) and callable(getattr(loader, "load_state_dict", None))
    state = loader.state_dict() if stateful else None
    try:
        yield
    finally:
        for g, value in saved:
            g.set_state(value)
        if stateful:
            loader.load_state_dict(state)


class _RNGStream:
    """A stream of the global RNGs (torch CPU, CUDA when initialized, numpy, python ``random``) seeded
    with ``seed``: each ``with stream:`` continues it where the previous one stopped."""

    def __init__(self, seed: int) -> None:
        torch.default_generator.manual_seed(seed)
        if _cuda_in_use():
            torch.cuda.manual_seed_all(seed)
        np.random.seed(seed % 2**32)
        random.seed(seed)
        self._state = self._global_state()

    def __enter__(self) -> None:
        torch.set_rng_state(self._state["torch"])
        np.random.set_state(self._state["numpy"])
        random.setstate(self._state["python"])
        if "cuda" in self._state:
            torch.cuda.set_rng_state_all(self._state["cuda"])

    def __exit__(self, *exc: object) -> None:
        self._state = self._global_state()

    @staticmethod
    def _global_state() -> dict[str, Any]:
        state = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
        if _cuda_in_use():
            state["cuda"] = torch.cuda.get_rng_state_all()
        return state


def _cuda_in_use() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_initialized()


def _unique(tensors: Iterable[Tensor]) -> list[Tensor]:
    seen: set[int] = set()
    out = []
    for t in tensors:
        if id(t) not in seen:
            seen.add(id(t))
            out.append(t)
    return out

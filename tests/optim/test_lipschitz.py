"""estimate_lipschitz and set_lr as plain functions, against numpy oracles and the schedulers' own formulas."""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader, TensorDataset

from lit_constrained.optim import ConstantStepAdam
from lit_constrained.optim.lipschitz import constant_step_size, estimate_lipschitz, reset_all_parameters
from lit_constrained.optim.lr_setting import set_lr

torch.set_num_threads(1)


# ---------------------------------------------------------------------------- a least-squares problem


class Linear(nn.Module):
    """f(batch) = 0.5 * mean_i (a_i . w - b_i)^2 over the rows of the batch."""

    def __init__(self, w0: np.ndarray) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.from_numpy(w0.copy()))

    def loss(self, batch: tuple[Tensor, Tensor]) -> Tensor:
        a, b = batch
        return 0.5 * ((a @ self.w - b) ** 2).mean()


class Cycling:
    """Sets w to candidates[0], candidates[1], ... in turn: a known set of weight samples."""

    def __init__(self, candidates: np.ndarray) -> None:
        self.candidates, self.calls = candidates, 0

    def __call__(self, module: nn.Module) -> None:
        with torch.no_grad():
            module.w.copy_(torch.from_numpy(self.candidates[self.calls % len(self.candidates)]))
        self.calls += 1


def _problem(n: int = 10, d: int = 3, k: int = 4, seed: int = 0) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, d)), rng.normal(size=n), rng.normal(size=d), rng.normal(scale=3.0, size=(k, d))


def _batches(a: np.ndarray, b: np.ndarray, sizes: list[int]) -> list[tuple[Tensor, Tensor]]:
    edges = np.cumsum([0, *sizes])
    return [(torch.from_numpy(a[i:j]), torch.from_numpy(b[i:j])) for i, j in zip(edges[:-1], edges[1:])]


def _rows(batch: tuple[Tensor, Tensor]) -> float:
    return float(batch[0].shape[0])


def _grad(a: np.ndarray, b: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Gradient of 0.5 * mean (a w - b)^2."""
    return a.T @ (a @ w - b) / len(b)


# ---------------------------------------------------------------------------- the estimate against numpy


@pytest.mark.parametrize("mode", ["full", "minibatch"])
def test_estimate_matches_numpy_with_unequal_batches(mode):
    a, b, w0, cand = _problem()
    model = Linear(w0)
    sampler = Cycling(cand)
    est = estimate_lipschitz(model, model.loss, _batches(a, b, [4, 4, 2]), sampler, seed=0, batch_size=_rows,
                             num_samples=len(cand), mode=mode)

    if mode == "full":  # the size-weighted mean of the batch losses is the loss over all rows
        expected = [np.linalg.norm(_grad(a, b, w)) for w in cand]
    else:  # Algorithm 3: the largest per-batch gradient norm
        slices = [slice(0, 4), slice(4, 8), slice(8, 10)]
        expected = [max(np.linalg.norm(_grad(a[s], b[s], w)) for s in slices) for w in cand]
    assert sampler.calls == len(cand)
    np.testing.assert_allclose(est.sample_norms, expected, rtol=1e-12)
    assert est.lipschitz == pytest.approx(max(expected), rel=1e-12)
    assert est.initial_loss == pytest.approx(0.5 * np.mean((a @ w0 - b) ** 2), rel=1e-12)
    assert torch.equal(model.w.detach(), torch.from_numpy(w0))  # the weights are put back


def test_max_batches_uses_the_first_batches_only():
    a, b, w0, cand = _problem(n=12)
    model = Linear(w0)
    est = estimate_lipschitz(model, model.loss, _batches(a, b, [5, 5, 2]), Cycling(cand), seed=0,
                             batch_size=_rows, num_samples=len(cand), mode="full", max_batches=2)
    assert est.lipschitz == pytest.approx(max(np.linalg.norm(_grad(a[:10], b[:10], w)) for w in cand), rel=1e-12)
    assert est.initial_loss == pytest.approx(0.5 * np.mean((a[:10] @ w0 - b[:10]) ** 2), rel=1e-12)


def test_closed_form_quadratic():
    """f(w) = 0.5 w^T H w, H = diag(h): grad f(w) = H w, so with w_n = e_i the norms are the h_i."""
    h = torch.tensor([1.0, 4.0, 9.0], dtype=torch.float64)
    model = Linear(np.ones(3))
    sampler = Cycling(np.eye(3))
    est = estimate_lipschitz(model, lambda _: 0.5 * (h * model.w**2).sum(), [None], sampler, seed=0,
                             batch_size=lambda _: 1, num_samples=3)
    assert est.sample_norms == [1.0, 4.0, 9.0] and est.lipschitz == 9.0
    assert est.initial_loss == 0.5 * (1 + 4 + 9)
    assert constant_step_size(est.initial_loss, est.lipschitz, 100) == pytest.approx(math.sqrt(2 * 7 / (9 * 100)))


class ThreadMean:
    """A mean over ``n`` threads, each standing for a rank: the collective ``reduce`` of data parallelism."""

    def __init__(self, n: int) -> None:
        self.n, self.slots = n, [torch.zeros(0)] * n
        self.barrier = threading.Barrier(n, timeout=60)

    def on_rank(self, rank: int) -> Callable[[Tensor], Tensor]:
        def reduce(t: Tensor) -> Tensor:
            self.slots[rank] = t.clone()
            self.barrier.wait()
            out = sum(self.slots) / self.n
            self.barrier.wait()
            return out

        return reduce


@pytest.mark.parametrize("mode", ["full", "minibatch"])
def test_reduce_over_two_ranks_weights_by_the_global_batch(mode):
    """Rank 0 holds rows 0..4 in batches of 3, 2; rank 1 rows 5..9 in batches of 1, 4. Global batch j is
    the j-th batch of both ranks: rows {0,1,2,5} then {3,4,6,7,8,9}."""
    a, b, w0, cand = _problem()
    shards = [_batches(a[:5], b[:5], [3, 2]), _batches(a[5:], b[5:], [1, 4])]
    mean = ThreadMean(2)
    results: list[Any] = [None, None]

    def run(rank: int) -> None:
        model = Linear(w0)
        results[rank] = estimate_lipschitz(model, model.loss, shards[rank], Cycling(cand), mean.on_rank(rank), seed=0,
                                           batch_size=_rows, num_samples=len(cand), mode=mode)

    threads = [threading.Thread(target=run, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results[0] is not None and results[0] == results[1]

    if mode == "full":
        expected = max(np.linalg.norm(_grad(a, b, w)) for w in cand)
    else:
        global_batches = [np.array([0, 1, 2, 5]), np.array([3, 4, 6, 7, 8, 9])]
        expected = max(np.linalg.norm(_grad(a[r], b[r], w)) for w in cand for r in global_batches)
    assert results[0].lipschitz == pytest.approx(expected, rel=1e-12)
    assert results[0].initial_loss == pytest.approx(0.5 * np.mean((a @ w0 - b) ** 2), rel=1e-12)


# ---------------------------------------------------------------------------- randomness and restoration


class DropoutNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Dropout(0.3), nn.Linear(8, 1)).double()

    def loss(self, batch: tuple[Tensor, Tensor]) -> Tensor:
        return ((self.net(batch[0]).squeeze(-1) - batch[1]) ** 2).mean()


def test_draws_are_the_seeded_stream_and_the_passes_a_second_one():
    """w_1..w_N: N reset_parameters in a row after seeding with `seed`; the passes (dropout) continue a stream
    seeded with seed + 1. Rebuilt here by hand, step by step."""
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(12, 4, generator=g, dtype=torch.float64), torch.randn(12, generator=g, dtype=torch.float64)
    batches = [(x[:6], y[:6]), (x[6:], y[6:])]
    torch.manual_seed(0)
    model = DropoutNet()
    reference = DropoutNet()
    reference.load_state_dict(model.state_dict())
    est = estimate_lipschitz(model, model.loss, batches, seed=123, batch_size=_rows, num_samples=3)

    torch.manual_seed(123)
    draws = []
    for _ in range(3):
        reset_all_parameters(reference)
        draws.append({k: v.clone() for k, v in reference.state_dict().items()})
    torch.manual_seed(124)
    norms = []
    for weights in draws:
        reference.load_state_dict(weights)
        loss = sum(reference.loss(batch) * 6 for batch in batches) / 12
        grads = torch.autograd.grad(loss, list(reference.parameters()))
        norms.append(float(torch.cat([t.reshape(-1) for t in grads]).norm()))
    np.testing.assert_allclose(est.sample_norms, norms, rtol=1e-12)
    assert len(set(norms)) == 3


def test_weights_and_buffers_are_put_back_also_on_error():
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 1)).double()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    x = torch.randn(8, 3, dtype=torch.float64)
    loss = lambda batch: model(batch).pow(2).mean()  # noqa: E731
    estimate_lipschitz(model, loss, [x, x[:5]], seed=0, batch_size=len, num_samples=2)
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k

    calls = []

    def failing(module: nn.Module) -> None:
        reset_all_parameters(module)
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("sampler failed")

    with pytest.raises(RuntimeError, match="sampler failed"):
        estimate_lipschitz(model, loss, [x], failing, seed=0, batch_size=len, num_samples=3)
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k


class CountingLoader:
    """A stateful loader (state_dict / load_state_dict, as torchdata's StatefulDataLoader): it counts passes."""

    def __init__(self, batches: list[Any]) -> None:
        self.batches, self.passes = batches, 0

    def __iter__(self) -> Iterator[Any]:
        self.passes += 1
        return iter(self.batches)

    def state_dict(self) -> dict[str, int]:
        return {"passes": self.passes}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.passes = state["passes"]


def test_the_loaders_generators_and_state_are_put_back():
    a, b, w0, cand = _problem(n=20)
    data = TensorDataset(torch.from_numpy(a), torch.from_numpy(b))

    def loader() -> DataLoader:  # its own generator, and a sampler with another one
        sampler = torch.utils.data.RandomSampler(data, generator=torch.Generator().manual_seed(2))
        return DataLoader(data, batch_size=3, sampler=sampler, generator=torch.Generator().manual_seed(1))

    used, fresh = loader(), loader()
    model = Linear(w0)
    estimate_lipschitz(model, model.loss, used, Cycling(cand), seed=0, batch_size=_rows, num_samples=3,
                       mode="minibatch")
    assert torch.equal(used.generator.get_state(), fresh.generator.get_state())
    assert torch.equal(used.sampler.generator.get_state(), fresh.sampler.generator.get_state())
    for (xa, _), (xb, _) in zip(used, fresh):  # the next pass is the one a loader never iterated gives
        assert torch.equal(xa, xb)

    counting = CountingLoader(_batches(a, b, [10, 10]))
    estimate_lipschitz(model, model.loss, counting, Cycling(cand), seed=0, batch_size=_rows, num_samples=3)
    assert counting.passes == 0


# ---------------------------------------------------------------------------- bad input


def _fit(**kwargs: Any) -> Any:
    a, b, w0, cand = _problem()
    model = Linear(w0)
    options: dict[str, Any] = dict(loss=model.loss, batches=_batches(a, b, [5, 5]), sampler=Cycling(cand), seed=0,
                                   batch_size=_rows, num_samples=2)
    options.update(kwargs)
    return estimate_lipschitz(model, **options)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"sampler": lambda m: setattr(m, "w", nn.Parameter(torch.zeros(3, dtype=torch.float64)))}, "in place"),
        ({"loss": lambda batch: batch[0].sum(dim=0)}, "scalar"),
        ({"loss": lambda batch: batch[1].pow(2).sum()}, "grad_fn"),
        ({"loss": lambda batch: torch.zeros((), requires_grad=True)}, r"L\(w0\)"),
        ({"loss": lambda batch: torch.tensor(math.nan, requires_grad=True)}, r"L\(w0\)"),
        ({"batches": []}, "no batch"),
        ({"seed": None}, "seed"),
        ({"num_samples": 0}, "num_samples"),
        ({"mode": "batch"}, "mode"),
        ({"max_batches": 0}, "max_batches"),
    ],
)
def test_bad_input_is_an_error_that_says_what(kwargs, match):
    with pytest.raises(ValueError, match=match):
        _fit(**kwargs)


def test_zero_lipschitz_estimate_is_an_error():
    a = np.random.default_rng(0).integers(-3, 4, size=(10, 3)).astype(np.float64)
    w_star = np.array([1.0, -2.0, 0.5])
    b = a @ w_star  # consistent and exact: the gradient vanishes at w_star, the loss does not at w0
    model = Linear(np.zeros(3))
    with pytest.raises(ValueError, match="L_hat"):
        estimate_lipschitz(model, model.loss, _batches(a, b, [5, 5]), Cycling(w_star[None, :]), seed=0,
                           batch_size=_rows, num_samples=2)


@pytest.mark.parametrize("args", [(0.0, 1.0, 10), (1.0, 0.0, 10), (1.0, math.inf, 10), (1.0, 1.0, 0)])
def test_constant_step_size_needs_positive_numbers(args):
    with pytest.raises(ValueError):
        constant_step_size(*args)


# ---------------------------------------------------------------------------- set_lr


def _two_groups(lr: float = 0.1) -> torch.optim.Optimizer:
    return torch.optim.SGD([{"params": [torch.zeros(2, requires_grad=True)]},
                            {"params": [torch.zeros(3, requires_grad=True)], "lr": 2 * lr}], lr=lr)


def test_set_lr_without_scheduler_writes_the_chosen_groups():
    opt = _two_groups()
    assert set_lr(opt, 0.5, groups=[1]) == [1]
    assert [g["lr"] for g in opt.param_groups] == [0.1, 0.5]
    assert "initial_lr" not in opt.param_groups[1]
    assert set_lr(opt, 0.7) == [0, 1] and [g["lr"] for g in opt.param_groups] == [0.7, 0.7]

    csa = ConstantStepAdam([torch.zeros(2, requires_grad=True)], lr=None)  # lr None: written as is
    set_lr(csa, 0.3)
    assert csa.param_groups[0]["lr"] == 0.3


def test_set_lr_keeps_a_lambda_schedules_factor_and_continues_from_the_new_base():
    opt = _two_groups()
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda t: 0.5**t)
    for _ in range(2):
        opt.step()
        sched.step()
    assert set_lr(opt, 0.3, groups=[1], schedulers=[sched]) == [1]
    # LambdaLR: lr_i(t) = base_i * 0.5^t; group 1 now has base 0.3, group 0 keeps 0.1
    assert sched.base_lrs == [0.1, 0.3] and opt.param_groups[1]["initial_lr"] == 0.3
    assert opt.param_groups[0]["lr"] == pytest.approx(0.1 * 0.25, rel=1e-15)
    assert opt.param_groups[1]["lr"] == pytest.approx(0.3 * 0.25, rel=1e-15)
    opt.step()
    sched.step()
    assert [g["lr"] for g in opt.param_groups] == pytest.approx([0.1 * 0.125, 0.3 * 0.125], rel=1e-15)


def test_set_lr_with_a_step_schedule():
    opt = _two_groups()
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.1)
    for _ in range(3):  # epochs 1, 2, 3: one decay so far
        opt.step()
        sched.step()
    set_lr(opt, 1.0, schedulers=[sched])
    assert sched.base_lrs == [1.0, 1.0]
    assert [g["lr"] for g in opt.param_groups] == pytest.approx([0.1, 0.1], rel=1e-12)
    opt.step()
    sched.step()  # epoch 4: the second decay, from the new base
    assert [g["lr"] for g in opt.param_groups] == pytest.approx([0.01, 0.01], rel=1e-12)


def test_set_lr_with_a_plateau_scheduler_and_bad_input():
    opt = _two_groups()
    plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(opt)  # no base_lrs: only the group lr changes
    set_lr(opt, 0.4, schedulers=[plateau])
    assert [g["lr"] for g in opt.param_groups] == [0.4, 0.4]
    other = torch.optim.lr_scheduler.LambdaLR(_two_groups(), lambda t: 1.0)
    with pytest.raises(ValueError, match="another optimizer"):
        set_lr(opt, 0.4, schedulers=[other])
    with pytest.raises(IndexError, match="no param group 2"):
        set_lr(opt, 0.4, groups=[2])

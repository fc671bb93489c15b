"""Violation metrics against independent NumPy computations on the union of all batches."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from lit_constrained.metrics import (
    VIOLATION_METRICS,
    L1Violation,
    L2Violation,
    MaxViolation,
    MeanViolation,
    RelativeViolation,
    build_violation_metric,
    check_metric_names,
    relative_violation,
    violation_l1,
    violation_l2,
    violation_max,
    violation_mean,
    violation_norm,
)


def _numpy_reference(c: np.ndarray) -> dict[str, float]:
    a = np.abs(c.reshape(-1))
    return {
        "max": float(a.max()) if a.size else 0.0,
        "mean": float(a.mean()) if a.size else math.nan,
        "l1": float(a.sum()),
        "l2": float(np.sqrt((a**2).sum())),
    }


FUNCTIONAL = {"max": violation_max, "mean": violation_mean, "l1": violation_l1, "l2": violation_l2}


@pytest.mark.parametrize("shape", [(7,), (3, 4), (2, 3, 5), ()])
def test_functional_matches_numpy(shape: tuple[int, ...]) -> None:
    gen = torch.Generator().manual_seed(0)
    c = torch.randn(shape, generator=gen, dtype=torch.float64)
    expected = _numpy_reference(c.numpy())
    for name, fn in FUNCTIONAL.items():
        assert fn(c).item() == pytest.approx(expected[name], rel=1e-12), name


def test_functional_complex_and_integer_residuals() -> None:
    c = torch.tensor([3 + 4j, -1j], dtype=torch.complex128)  # moduli 5 and 1
    assert violation_max(c).item() == pytest.approx(5.0)
    assert violation_l1(c).item() == pytest.approx(6.0)
    assert violation_l2(c).item() == pytest.approx(math.sqrt(26.0))
    ints = torch.tensor([1, -2, 2])
    assert violation_mean(ints).item() == pytest.approx(5.0 / 3.0)
    assert violation_l2(ints).item() == pytest.approx(3.0)


def test_functional_empty_residuals() -> None:
    empty = torch.zeros(0)
    assert violation_max(empty).item() == 0.0
    assert violation_l1(empty).item() == 0.0
    assert violation_l2(empty).item() == 0.0
    assert math.isnan(violation_mean(empty).item())


def test_violation_norm_orders_and_nan_propagation() -> None:
    c = torch.tensor([1.0, -2.0, 2.0])
    assert violation_norm(c, 1).item() == pytest.approx(5.0)
    assert violation_norm(c, 2).item() == pytest.approx(3.0)
    assert violation_norm(c, float("inf")).item() == pytest.approx(2.0)
    assert violation_norm(c, "inf").item() == pytest.approx(2.0)
    bad = torch.tensor([1.0, float("nan")])
    for fn in FUNCTIONAL.values():
        assert math.isnan(fn(bad).item())


def test_relative_violation_functional() -> None:
    c = torch.tensor([0.1, -0.2, 0.2])  # l2 norm 0.3, l1 0.5, max 0.2
    c0 = torch.tensor([[1.0, 2.0], [2.0, 0.0]])  # l2 norm 3, l1 5, max 2
    assert relative_violation(c, c0).item() == pytest.approx(0.1)
    assert relative_violation(c, c0, p=1).item() == pytest.approx(0.1)
    assert relative_violation(c, c0, p=float("inf")).item() == pytest.approx(0.1)
    assert relative_violation(c, 0.6).item() == pytest.approx(0.5)
    assert relative_violation(c, torch.tensor(0.6)).item() == pytest.approx(0.5)
    assert relative_violation(c, 0.0).item() == pytest.approx(0.3)  # ||c_0|| = 0: divide by 1
    assert relative_violation(c, torch.zeros(4)).item() == pytest.approx(0.3)


CLASSES = {"max": MaxViolation, "mean": MeanViolation, "l1": L1Violation, "l2": L2Violation}


@pytest.mark.parametrize("name", sorted(CLASSES))
def test_accumulated_metric_equals_value_on_union(name: str) -> None:
    gen = torch.Generator().manual_seed(1)
    shards = [torch.randn(n, generator=gen) * s for n, s in [(5, 1.0), (0, 1.0), (13, 3.0), (2, 0.1)]]
    metric = CLASSES[name]()
    for shard in shards:
        metric.update(shard)
    union = torch.cat(shards).numpy().astype(np.float64)
    assert metric.compute().item() == pytest.approx(_numpy_reference(union)[name], rel=1e-6)
    metric.reset()
    metric.update(shards[0])
    assert metric.compute().item() == pytest.approx(_numpy_reference(shards[0].numpy())[name], rel=1e-6)


@pytest.mark.parametrize("name", sorted(CLASSES))
def test_forward_returns_batch_value_and_keeps_global(name: str) -> None:
    a, b = torch.tensor([3.0, -1.0]), torch.tensor([0.5, 0.25, -4.0])
    metric = CLASSES[name]()
    assert metric(a).item() == pytest.approx(_numpy_reference(a.numpy())[name])
    assert metric(b).item() == pytest.approx(_numpy_reference(b.numpy())[name])
    union = torch.cat([a, b]).numpy()
    assert metric.compute().item() == pytest.approx(_numpy_reference(union)[name])


def test_float64_states_accumulate_tiny_violations_exactly() -> None:
    c = torch.full((1000,), 1e-9, dtype=torch.float64)
    metric = L2Violation().set_dtype(torch.float64)
    for chunk in c.split(7):
        metric.update(chunk)
    assert metric.compute().dtype == torch.float64
    assert metric.compute().item() == pytest.approx(1e-9 * math.sqrt(1000), rel=1e-12)


def test_update_detaches_its_input() -> None:
    x = torch.tensor([1.0, -2.0], requires_grad=True)
    c = 3 * x
    for cls in [*CLASSES.values(), RelativeViolation]:
        metric = cls()
        metric.update(c)
        value = metric.compute()
        assert value.grad_fn is None and not value.requires_grad


def test_max_propagates_nan() -> None:
    metric = MaxViolation()
    metric.update(torch.tensor([1.0]))
    metric.update(torch.tensor([float("nan")]))
    metric.update(torch.tensor([2.0]))
    assert math.isnan(metric.compute().item())


def test_relative_takes_first_value_and_keeps_it_across_reset() -> None:
    metric = RelativeViolation()
    assert metric.reference is None
    metric.update(torch.tensor([3.0]))
    metric.update(torch.tensor([-4.0]))
    assert metric.compute().item() == pytest.approx(1.0)
    assert metric.reference == pytest.approx(5.0)
    metric.reset()
    metric.update(torch.tensor([0.6, 0.8]))
    assert metric.compute().item() == pytest.approx(0.2)
    metric.reset_reference()
    metric.reset()
    metric.update(torch.tensor([0.6, 0.8]))
    assert metric.compute().item() == pytest.approx(1.0)
    assert metric.reference == pytest.approx(1.0)


def test_relative_with_given_reference_and_orders() -> None:
    c0 = torch.tensor([4.0, -2.0])
    for p, norm_c0 in [(1, 6.0), (2, math.sqrt(20.0)), (float("inf"), 4.0)]:
        metric = RelativeViolation(p=p, reference=c0)
        assert metric.reference == pytest.approx(norm_c0)
        metric.update(torch.tensor([1.0]))
        metric.update(torch.tensor([-1.0]))
        expected = {1: 2.0, 2: math.sqrt(2.0), float("inf"): 1.0}[p] / norm_c0
        assert metric.compute().item() == pytest.approx(expected)
    scalar = RelativeViolation(reference=2.0)
    scalar.update(torch.tensor([1.0]))
    assert scalar.compute().item() == pytest.approx(0.5)
    zero = RelativeViolation(reference=0.0)
    zero.update(torch.tensor([0.5]))
    assert zero.compute().item() == pytest.approx(0.5)  # ||c_0|| = 0: divide by 1


def test_relative_ignores_non_finite_first_value() -> None:
    metric = RelativeViolation()
    metric.update(torch.tensor([float("inf")]))
    assert math.isinf(metric.compute().item())
    assert metric.reference is None
    metric.reset()
    metric.update(torch.tensor([2.0]))
    assert metric.compute().item() == pytest.approx(1.0)
    assert metric.reference == pytest.approx(2.0)


def test_relative_first_forward_sets_reference() -> None:
    metric = RelativeViolation()
    assert metric(torch.tensor([2.0])).item() == pytest.approx(1.0)
    assert metric(torch.tensor([1.0])).item() == pytest.approx(0.5)


def test_relative_reference_is_checkpointed() -> None:
    metric = RelativeViolation()
    metric.update(torch.tensor([3.0, 4.0]))
    metric.compute()
    restored = RelativeViolation()
    restored.load_state_dict(metric.state_dict())
    assert restored.reference == pytest.approx(5.0)
    restored.update(torch.tensor([0.5]))
    assert restored.compute().item() == pytest.approx(0.1)


def test_bad_input_raises_clear_errors() -> None:
    with pytest.raises(ValueError, match="torch.Tensor"):
        MaxViolation().update([1.0, 2.0])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="torch.Tensor"):
        violation_l2(None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="norm order"):
        RelativeViolation(p=3)
    with pytest.raises(ValueError, match="norm order"):
        violation_norm(torch.ones(2), p=0.5)
    with pytest.raises(ValueError, match=">= 0"):
        RelativeViolation(reference=-1.0)
    with pytest.raises(ValueError, match=">= 0"):
        relative_violation(torch.ones(2), float("nan"))
    with pytest.raises(ValueError, match="reference"):
        RelativeViolation(reference="big")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="Unknown violation metric"):
        check_metric_names(["max", "linf"])
    with pytest.raises(ValueError, match="Unknown violation metric"):
        check_metric_names([])
    with pytest.raises(ValueError, match="Duplicate"):
        check_metric_names(["max", "max"])


def test_registry_builds_each_metric_with_kwargs() -> None:
    for name, cls in VIOLATION_METRICS.items():
        metric = build_violation_metric(name, sync_on_compute=False)
        assert isinstance(metric, cls) and metric.sync_on_compute is False
    assert check_metric_names("l2") == ("l2",)

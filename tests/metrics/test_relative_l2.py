"""The relative L2 error: the one-batch function (global and per sample) and the accumulating metric,
against NumPy."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lit_constrained.metrics.relative_l2 import RelativeL2Error, relative_l2_error


def test_metric_accumulates_the_global_ratio_over_batches() -> None:
    metric = RelativeL2Error()
    truth = torch.tensor([3.0, 4.0])
    metric.update(truth + torch.tensor([0.5, 0.0]), truth)
    assert metric.compute().item() == pytest.approx(0.1)
    gen = torch.Generator().manual_seed(0)
    prediction, target = torch.randn(7, 3, generator=gen), torch.randn(7, 3, generator=gen)
    metric.reset()
    for rows in (slice(0, 2), slice(2, 7)):
        metric.update(prediction[rows], target[rows])
    p, t = prediction.double().numpy(), target.double().numpy()
    assert metric.compute().item() == pytest.approx(np.linalg.norm(p - t) / np.linalg.norm(t), rel=1e-12)
    with pytest.raises(ValueError, match="shapes differ"):
        metric.update(torch.zeros(2), torch.zeros(3))


def test_function_global_and_per_sample_against_numpy() -> None:
    gen = torch.Generator().manual_seed(1)
    prediction = torch.randn(4, 5, 6, dtype=torch.float64, generator=gen)
    target = torch.randn(4, 5, 6, dtype=torch.float64, generator=gen)
    p, t = prediction.numpy(), target.numpy()
    assert relative_l2_error(prediction, target).item() == pytest.approx(
        np.linalg.norm(p - t) / np.linalg.norm(t), rel=1e-12)
    per_sample = np.mean([np.linalg.norm(p[i] - t[i]) / np.linalg.norm(t[i]) for i in range(4)])
    assert relative_l2_error(prediction, target, per_sample=True).item() == pytest.approx(per_sample, rel=1e-12)
    assert relative_l2_error(prediction.float(), target.float()).dtype == torch.float32  # the inputs' dtype
    with pytest.raises(ValueError, match="shapes differ"):
        relative_l2_error(prediction, target[:2])

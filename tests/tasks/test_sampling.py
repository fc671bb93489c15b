"""Rows to batches: the row collate, full and mini-batch loaders, the seeded resumable shuffle."""

from __future__ import annotations

import pytest
import torch

from lit_constrained.tasks.sampling import RowCollate, row_loader


def test_row_loader_full_and_minibatch() -> None:
    rows = {"x": torch.arange(10.0)[:, None], "y": torch.arange(10.0) * 2}
    collate = RowCollate(rows, fixed={"anchor": torch.ones(3)})
    full = list(row_loader(10, collate, "full", 0.3, shuffle=True))
    assert len(full) == 1 and torch.equal(full[0]["x"][:, 0], torch.arange(10.0))
    torch.manual_seed(0)
    mini = list(row_loader(10, collate, "minibatch", 0.3, shuffle=True))
    assert [len(b["y"]) for b in mini] == [3, 3, 3, 1]
    x = torch.cat([b["x"][:, 0] for b in mini])
    assert sorted(x.tolist()) == list(range(10))  # one pass over the rows
    for b in mini:
        assert torch.equal(b["y"], 2 * b["x"][:, 0]) and torch.equal(b["anchor"], torch.ones(3))
    with pytest.raises(ValueError, match="same first dimension"):
        RowCollate({"x": torch.zeros(3), "y": torch.zeros(4)})


# --- the resumable, seeded training loader ---------------------------------------------------------


def _loader(seed: int | None = 7) -> torch.utils.data.DataLoader:
    collate = RowCollate(rows={"i": torch.arange(10)})
    return row_loader(10, collate, "minibatch", 0.3, True, seed=seed)


def _epoch(loader: torch.utils.data.DataLoader, epoch: int) -> list[list[int]]:
    loader.sampler.set_epoch(epoch)
    return [batch["i"].tolist() for batch in loader]


def test_minibatch_order_depends_on_seed_and_epoch_not_on_the_global_rng() -> None:
    torch.manual_seed(0)
    first = _epoch(_loader(), 3)
    torch.manual_seed(123)
    assert _epoch(_loader(), 3) == first
    assert _epoch(_loader(), 4) != first
    assert _epoch(_loader(seed=8), 3) != first
    assert sorted(sum(first, [])) == list(range(10)) and [len(b) for b in first] == [3, 3, 3, 1]


def test_loader_resumes_mid_epoch_from_its_state() -> None:
    full = _loader()
    uninterrupted = _epoch(full, 2)
    interrupted = _loader()
    interrupted.sampler.set_epoch(2)
    iterator = iter(interrupted)
    seen = [next(iterator)["i"].tolist() for _ in range(2)]
    state = interrupted.state_dict()
    assert state == {"epoch": 2, "batches": 2, "seed": 7}
    resumed = _loader(seed=99)  # the saved seed wins
    resumed.load_state_dict(state)
    rest = [batch["i"].tolist() for batch in resumed]
    assert seen + rest == uninterrupted
    assert resumed.state_dict()["batches"] == 4


def test_loader_state_saved_at_the_end_of_an_epoch_resumes_at_the_next() -> None:
    loader = _loader()
    _epoch(loader, 1)
    state = loader.state_dict()
    assert state["batches"] == len(loader)
    resumed = _loader()
    resumed.load_state_dict(state)
    assert resumed.sampler.epoch == 2
    assert [batch["i"].tolist() for batch in resumed] == _epoch(_loader(), 2)

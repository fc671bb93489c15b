"""Shared task helpers: the MLP builder, row batches, the npz cache, dtype names."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from lit_constrained.batch import cast_floats
from lit_constrained.tasks.common import (
    RowCollate,
    cache_key,
    cached_arrays,
    mlp,
    row_loader,
    torch_dtype,
)


def test_mlp_shapes_and_parameter_counts() -> None:
    # (in, hidden, depth, out) -> number of weights and biases, counted by hand
    for args, expected in [((1, 32, 3, 1), 64 + 2 * 1056 + 33), ((5, 64, 3, 4), 384 + 2 * 4160 + 260)]:
        net = mlp(*args)
        assert sum(p.numel() for p in net.parameters()) == expected
        assert net(torch.zeros(7, args[0])).shape == (7, args[3])
    assert sum(isinstance(layer, nn.Tanh) for layer in mlp(2, 8, 3, 1)) == 3
    assert isinstance(mlp(2, 8, 1, 1, activation=nn.ReLU)[1], nn.ReLU)
    with pytest.raises(ValueError, match="hidden"):
        mlp(1, 0, 3, 1)
    with pytest.raises(ValueError, match="depth"):
        mlp(1, 8, -1, 1)


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


def test_cached_arrays_round_trip(tmp_path: Path) -> None:
    calls = []

    def generate() -> dict[str, np.ndarray]:
        calls.append(1)
        return {"a": np.arange(4.0), "b": np.eye(2, dtype=bool)}

    first = cached_arrays("thing", {"n": 4}, generate, tmp_path)
    second = cached_arrays("thing", {"n": 4}, generate, tmp_path)
    assert len(calls) == 1
    for key in first:
        np.testing.assert_array_equal(first[key], second[key])
    cached_arrays("thing", {"n": 5}, generate, tmp_path)  # other arguments: another file
    assert len(calls) == 2 and len(list(tmp_path.glob("thing-*.npz"))) == 2
    cached_arrays("thing", {"n": 4}, generate, None)  # no cache
    assert len(calls) == 3


def test_dtype_names_and_cast() -> None:
    assert torch_dtype("float64") is torch.float64
    with pytest.raises(ValueError, match="dtype"):
        torch_dtype("half")
    batch = cast_floats({"x": torch.zeros(2, dtype=torch.float64), "i": torch.zeros(2, dtype=torch.long)},
                        torch.float32)
    assert batch["x"].dtype == torch.float32 and batch["i"].dtype == torch.long


# --- cache integrity -----------------------------------------------------------------------------


def _counting_generator(calls: list[int]):
    def generate() -> dict[str, np.ndarray]:
        calls.append(1)
        return {"u": np.linspace(0.0, 1.0, 50), "mask": np.arange(50) % 3 == 0}

    return generate


def _only_file(tmp_path: Path) -> Path:
    (path,) = tmp_path.glob("thing-*.npz")
    return path


def test_cache_key_covers_generator_version_and_every_argument() -> None:
    base = cache_key("thing", {"n": 4, "seed": 0})
    assert cache_key("thing", {"n": 4, "seed": 0}) == base
    assert cache_key("thing", {"n": 4, "seed": 1}) != base
    assert cache_key("thing", {"n": 4, "seed": 0}, version="2") != base


def test_truncated_cache_file_is_regenerated_with_a_warning_naming_it(tmp_path: Path) -> None:
    calls: list[int] = []
    generate = _counting_generator(calls)
    expected = cached_arrays("thing", {"n": 4}, generate, tmp_path)
    path = _only_file(tmp_path)
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])  # a crash mid-copy, a full disk
    with pytest.warns(UserWarning, match=rf"Regenerating the cached dataset {path}: unreadable"):
        again = cached_arrays("thing", {"n": 4}, generate, tmp_path)
    assert len(calls) == 2
    np.testing.assert_array_equal(again["u"], expected["u"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the regenerated file is good again
        cached_arrays("thing", {"n": 4}, generate, tmp_path)
    assert len(calls) == 2


def test_wrong_content_fails_the_checksum_and_is_regenerated(tmp_path: Path) -> None:
    calls: list[int] = []
    generate = _counting_generator(calls)
    cached_arrays("thing", {"n": 4}, generate, tmp_path)
    path = _only_file(tmp_path)
    with np.load(path) as data:
        stored = {k: data[k] for k in data.files}
    stored["u"] = stored["u"] * 10  # a valid npz, wrong numbers, the old checksum kept
    np.savez(path, **stored)
    with pytest.warns(UserWarning, match=rf"{path}: checksum mismatch"):
        again = cached_arrays("thing", {"n": 4}, generate, tmp_path)
    np.testing.assert_array_equal(again["u"], np.linspace(0.0, 1.0, 50))
    assert len(calls) == 2


def test_file_without_records_or_for_other_arguments_is_regenerated(tmp_path: Path) -> None:
    calls: list[int] = []
    generate = _counting_generator(calls)
    cached_arrays("thing", {"n": 4}, generate, tmp_path)
    path = _only_file(tmp_path)
    np.savez(path, u=np.zeros(3))  # an old-format file
    with pytest.warns(UserWarning, match="no checksum"):
        cached_arrays("thing", {"n": 4}, generate, tmp_path)
    other = tmp_path / "other"
    other.mkdir()
    cached_arrays("thing", {"n": 5}, generate, other)
    _only_file(other).replace(other / path.name)  # a file made for n=5 under n=4's name
    with pytest.warns(UserWarning, match="made for"):
        again = cached_arrays("thing", {"n": 4}, generate, other)
    assert len(calls) == 4 and set(again) == {"u", "mask"}


def test_not_a_zip_file_gives_a_warning_not_a_zipfile_traceback(tmp_path: Path) -> None:
    calls: list[int] = []
    generate = _counting_generator(calls)
    cached_arrays("thing", {"n": 4}, generate, tmp_path)
    path = _only_file(tmp_path)
    path.write_text("not a zip file")
    with pytest.warns(UserWarning, match=rf"{path}: unreadable"):
        cached_arrays("thing", {"n": 4}, generate, tmp_path)
    assert len(calls) == 2


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

"""The npz cache of generated arrays: keys, round trip, integrity checks."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest

from lit_constrained.tasks.cache import cache_key, cached_arrays


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

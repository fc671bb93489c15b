"""lit_constrained/imposed.py: the senses of a part (parsing, the signs, the split into c = 0 and
g <= 0, the violated part), a part's per-point data (handed to the residual, cut with the points) and the
coupled parts, each against a hand computation."""

from __future__ import annotations

import pytest
import torch

from lit_constrained.imposed import (
    SENSES, Coupled, Imposed, PartLayout, SenseRows, active_rows, check_sense, imposed_values, layout_signs, part_layout,
    violated_part,
)

X = torch.zeros(3, 1)


def _identity(x: torch.Tensor) -> torch.Tensor:
    return x[:, 0]


@pytest.mark.parametrize("sense", ["=", "<=", ">="])
def test_the_three_senses_are_taken(sense: str) -> None:
    assert Imposed(_identity, X, sense=sense).sense == sense
    assert check_sense(sense) == sense


def test_the_default_sense_is_an_equality() -> None:
    assert Imposed(_identity, X).sense == "="
    assert SENSES == ("=", "<=", ">=")


@pytest.mark.parametrize("bad", ["==", "<", ">", "ge", "", None, 1])
def test_any_other_sense_is_rejected_naming_the_three(bad: object) -> None:
    with pytest.raises(ValueError) as error:
        Imposed(_identity, X, sense=bad)  # type: ignore[arg-type]
    message = str(error.value)
    assert "'='" in message and "'<='" in message and "'>='" in message and repr(bad) in message


def test_the_layout_carries_each_part_sense_and_its_signs() -> None:
    parts = {"b": Imposed(_identity, torch.zeros(2, 1)), "lo": Imposed(_identity, X, sense=">="),
             "hi": Imposed(_identity, torch.zeros(1, 1), sense="<=")}
    values = {"b": torch.zeros(2, 1), "lo": torch.zeros(3, 1), "hi": torch.zeros(1, 1)}
    layout = part_layout(values, parts)
    assert [(p.name, p.offset, p.size, p.sense) for p in layout] == [
        ("b", 0, 2, "="), ("lo", 2, 3, ">="), ("hi", 5, 1, "<=")]
    assert layout_signs(layout).tolist() == [0, 0, -1, -1, -1, 1]
    assert layout_signs((PartLayout("b", 0, 2, 1),)) is None  # equalities only: today's step


def test_the_signs_are_one_tensor_per_layout() -> None:
    """The step caches its split of the rows by the signs tensor: an equal layout gives the same one."""
    first = (PartLayout("b", 0, 2, 1), PartLayout("lo", 2, 3, 1, ">="))
    again = (PartLayout("b", 0, 2, 1), PartLayout("lo", 2, 3, 1, ">="))
    assert layout_signs(first) is layout_signs(again)
    assert layout_signs(first) is not layout_signs((PartLayout("b", 0, 2, 1), PartLayout("lo", 2, 3, 1, "<=")))


# ---------------------------------------------------------------------------- per-point data
def _flux(x: torch.Tensor, data: dict[str, torch.Tensor]) -> torch.Tensor:
    return (x * data["n"]).sum(dim=1) - data["g"]


def test_data_is_handed_to_the_residual_beside_the_points_and_cut_with_them() -> None:
    x = torch.arange(8.0).reshape(4, 2)
    data = {"n": torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [0.0, 0.0]]), "g": torch.tensor([0.0, 1.0, 2.0, 3.0])}
    part = Imposed(_flux, x, data=data)
    assert part.values().tolist() == [0.0, 2.0, 7.0, -3.0]  # x . n - g, point by point
    two = part.at(torch.tensor([1, 3]))
    assert two.points.tolist() == [[2.0, 3.0], [6.0, 7.0]] and two.data["g"].tolist() == [1.0, 3.0]
    assert two.values().tolist() == [2.0, -3.0]
    assert imposed_values({"flux": part})["flux"].shape == (4, 1)
    weights = Imposed(lambda x, w: w * x[:, 0], x, data=torch.tensor([1.0, 2.0, 3.0, 4.0]))  # a tensor as data
    assert weights.at(slice(2, 4)).values().tolist() == [12.0, 24.0]
    moved = part.to(dtype=torch.float64)
    assert moved.points.dtype == moved.data["n"].dtype == torch.float64


@pytest.mark.parametrize("bad, message", [
    (torch.zeros(2), "one row per point \\(3, ...\\), got \\(2,\\)"),
    ({"n": torch.zeros(3, 2), "g": torch.zeros(4)}, "data\\['g'\\] must be a tensor with one row per point"),
    ({}, "non-empty dict"),
    ([torch.zeros(3)], "a tensor or a non-empty dict"),
])
def test_data_of_another_shape_is_refused(bad: object, message: str) -> None:
    with pytest.raises((ValueError, TypeError), match=message):
        Imposed(_flux, torch.zeros(3, 2), data=bad)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------- coupled rows
def test_a_coupled_part_gives_its_rows_with_its_sense() -> None:
    x = torch.tensor([[1.0], [2.0], [3.0]])
    parts = {"mass": Coupled(lambda: x.sum() - 6.0), "nonnegative": Imposed(_identity, x, sense=">="),
             "pairs": Coupled(lambda: x[1:] - x[:-1], sense="<=")}
    values = imposed_values(parts)
    assert {name: tuple(v.shape) for name, v in values.items()} == {"mass": (1, 1), "nonnegative": (3, 1), "pairs": (2, 1)}
    layout = part_layout(values, parts)
    assert layout_signs(layout).tolist() == [0, -1, -1, -1, 1, 1]
    with pytest.raises(ValueError, match="coupled part 'bad' returned shape \\(1, 1, 1\\)"):
        imposed_values({"bad": Coupled(lambda: torch.zeros(1, 1, 1))})
    with pytest.raises(ValueError, match="Coupled: sense must be"):
        Coupled(lambda: x.sum(), sense="==")


def test_the_split_signs_the_inequality_rows_to_read_g_below_zero() -> None:
    """r = (1, 2, 3, 4) with senses (=, >=, <=, =): c_E = (1, 4), g = (-2, 3); G the same rows of J,
    the '>=' row negated (by hand)."""
    r = torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.float64)
    J = torch.arange(8.0, dtype=torch.float64).reshape(4, 2)
    rows = SenseRows.of(torch.tensor([0, -1, 1, 0], dtype=torch.int8))
    c_eq, J_eq, g, G = rows.split(r, J)
    assert c_eq.tolist() == [1.0, 4.0] and g.tolist() == [-2.0, 3.0]
    assert J_eq.tolist() == [[0.0, 1.0], [6.0, 7.0]]
    assert G.tolist() == [[-2.0, -3.0], [4.0, 5.0]]
    assert (rows.m, rows.p) == (2, 2)


def test_contiguous_rows_are_views_of_j() -> None:
    J = torch.randn(5, 3)
    rows = SenseRows.of(torch.tensor([0, 0, 1, 1, 1], dtype=torch.int8))
    _, J_eq, _, G = rows.split(torch.randn(5), J)
    assert J_eq.data_ptr() == J.data_ptr() and G.data_ptr() == J[2:].data_ptr()  # no copy of J's rows
    assert G.shape == (3, 3)


def test_the_violated_part_against_a_hand_computation() -> None:
    """v: c on '=' rows, max(r, 0) on '<=' rows, max(-r, 0) on '>=' rows."""
    r = torch.tensor([-0.5, 0.25, -0.75, 0.5, -2.0, 3.0])
    signs = torch.tensor([0, 0, 1, 1, -1, -1], dtype=torch.int8)
    assert violated_part(r, signs).tolist() == [-0.5, 0.25, 0.0, 0.5, 2.0, 0.0]
    assert violated_part(r, None) is r
    # W = 2 copies of the m = 3 rows (the ranks' union): the signs repeat
    two = violated_part(torch.tensor([1.0, -1.0, 1.0, 1.0, -1.0, 1.0]), torch.tensor([0, 1, -1], dtype=torch.int8))
    assert two.tolist() == [1.0, 0.0, 0.0, 1.0, 0.0, 0.0]


def test_the_violated_part_is_differentiable() -> None:
    r = torch.tensor([0.5, -0.5, 2.0], requires_grad=True)
    violated_part(r, torch.tensor([0, -1, 1], dtype=torch.int8)).pow(2).sum().backward()
    assert r.grad.tolist() == [1.0, -1.0, 4.0]  # d/dr of r^2, max(-r, 0)^2 = r^2 (r < 0), r^2


def test_active_rows_counts_those_within_tol_of_the_bound() -> None:
    g = torch.tensor([-1.0, -1e-9, 0.0, 1e-3, -1e-5], dtype=torch.float64)
    assert active_rows(g) == 3  # -1e-9, 0, 1e-3 (tol sqrt(eps) = 1.5e-8)
    assert active_rows(g, tol=1e-4) == 4
    assert active_rows(torch.zeros(0)) == 0

"""lit_constrained/imposed.py: the senses of a part (parsing, the signs, the split into c = 0 and
g <= 0, the violated part), each against a hand computation."""

from __future__ import annotations

import pytest
import torch

from lit_constrained.imposed import (
    SENSES, Imposed, PartLayout, SenseRows, active_rows, check_sense, layout_signs, part_layout, sense_signs,
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


def test_sense_signs_one_for_all_rows_or_one_per_row() -> None:
    assert sense_signs(">=", 3).tolist() == [-1, -1, -1]
    assert sense_signs(["=", "<=", ">="], 3).tolist() == [0, 1, -1]
    assert sense_signs("=", 4) is None and sense_signs(["=", "="], 2) is None
    with pytest.raises(ValueError, match="2 senses for the 3 constraint rows"):
        sense_signs(["=", "<="], 3)
    with pytest.raises(ValueError, match="'>='"):
        sense_signs(["=", "=>"], 2)


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

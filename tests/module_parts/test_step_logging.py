"""module_parts.step_logging: each imposed part's max |c| from its rows, also over W ranks' stacked c."""

from __future__ import annotations

import torch

from lit_constrained.imposed import PartLayout
from lit_constrained.module_parts.step_logging import part_violations

LAYOUT = (PartLayout("pde", 0, 3, 1), PartLayout("boundary", 3, 2, 2))  # m = 3 + 4 = 7


def test_each_part_is_the_max_over_its_own_rows() -> None:
    c = torch.tensor([0.1, -0.5, 0.2, 3.0, -4.0, 0.0, 1.0])
    assert part_violations(LAYOUT, c, "train") == {
        "Violation/pde/train": torch.tensor(0.5), "Violation/boundary/train": torch.tensor(4.0),
    }


def test_stacked_ranks_are_one_union_per_part() -> None:
    rank0 = torch.tensor([0.1, -0.5, 0.2, 3.0, -4.0, 0.0, 1.0])
    rank1 = torch.tensor([-0.9, 0.0, 0.0, 0.0, 0.0, 6.0, 0.0])
    parts = part_violations(LAYOUT, torch.cat([rank0, rank1]), "val")
    assert parts == {"Violation/pde/val": torch.tensor(0.9), "Violation/boundary/val": torch.tensor(6.0)}


def test_one_part_or_a_mismatched_c_has_no_part_tags() -> None:
    assert part_violations(LAYOUT[:1], torch.ones(3), "train") == {}  # one part: Violation/train itself
    assert part_violations(None, torch.ones(7), "train") == {}
    assert part_violations(LAYOUT, torch.ones(8), "train") == {}  # not W x m rows

"""module_parts.row_choice: which points of a pool are imposed (``Imposed(..., count=k | "auto")``), how many
``"auto"`` takes within its cost budget, the choice kept in checkpoints (resume bit-exact) and the same on
every DDP rank."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader

from lit_constrained import ConstrainedModule, Imposed
from lit_constrained.module_parts.row_choice import (
    CHECKPOINT_KEY, FIRST_CHECK, SETTLING_CORRECTIONS, CostModel, RowChoice, auto_counts, equal_shares, farthest_points, row_scores, spread_largest,
)
from tests.helpers.lightning import quiet_trainer


# --------------------------------------------------------------------------------------- the rule
def test_the_largest_residuals_spread_over_the_domain_are_chosen() -> None:
    """Two bumps of |r| on [0, 1], peaks at 0.2 (height 3) and 0.7 (height 2): k = 2 takes both peaks, not the
    tallest peak and its neighbour; k = 1 the tallest."""
    x = torch.linspace(0, 1, 101, dtype=torch.float64)[:, None]
    score = 3 * torch.exp(-((x[:, 0] - 0.2) / 0.05) ** 2) + 2 * torch.exp(-((x[:, 0] - 0.7) / 0.05) ** 2)
    assert spread_largest(x, score, 2).tolist() == [20, 70]
    assert spread_largest(x, score, 1).tolist() == [20]
    assert spread_largest(x, score, 200).tolist() == list(range(101))  # k >= N: every point


def test_without_room_the_best_scored_fill_up() -> None:
    """Ten points in a cluster of width 1e-3 and one far away: k = 5 cannot be spread, the best fill up."""
    x = torch.cat([torch.linspace(0, 1e-3, 10), torch.tensor([1.0])])[:, None]
    score = torch.arange(11, dtype=torch.float64)  # the far point scores highest
    assert spread_largest(x, score, 5).tolist() == [6, 7, 8, 9, 10]


def test_spread_points_are_the_farthest_ones_whatever_the_pool_order() -> None:
    """101 points of [0, 1]: the centre first, then the ends, then the quarters, as a hand count says; the
    same coordinates from the pool shuffled."""
    x = torch.linspace(0, 1, 101, dtype=torch.float64)[:, None]
    assert farthest_points(x, 3).tolist() == [0, 50, 100]
    assert farthest_points(x, 5).tolist() == [0, 25, 50, 75, 100]
    order = torch.randperm(101, generator=torch.Generator().manual_seed(0))
    shuffled = x[order]
    assert sorted(shuffled[farthest_points(shuffled, 5), 0].tolist()) == x[[0, 25, 50, 75, 100], 0].tolist()
    assert farthest_points(x, 200).tolist() == list(range(101)) and farthest_points(x, 0).numel() == 0


def test_spread_points_cover_the_pool_within_twice_the_best_covering_radius() -> None:
    """30 random points of a 3 x 1 box (scaled to the unit square, as the rule scales), k = 3: the largest
    distance of a pool point to the chosen ones is at most twice the least over all 4 060 triples (brute
    force)."""
    import itertools

    points = torch.rand(30, 2, generator=torch.Generator().manual_seed(1), dtype=torch.float64) * torch.tensor([3.0, 1.0])
    unit = (points - points.min(0).values) / (points.max(0).values - points.min(0).values)
    distances = torch.cdist(unit, unit)

    def covering(index: list[int]) -> float:
        return float(distances[:, index].min(dim=1).values.max())

    best = min(covering(list(triple)) for triple in itertools.combinations(range(30), 3))
    assert covering(farthest_points(points, 3).tolist()) <= 2 * best + 1e-12


def test_an_unknown_choice_rule_is_refused_with_the_choices() -> None:
    with pytest.raises(ValueError, match="imposed_choice must be one of 'spread', 'largest'"):
        RowChoice(rule="worst")


def test_scores_follow_the_sense() -> None:
    r = torch.tensor([[-2.0, 0.5], [1.0, -0.1], [float("nan"), 0.0]], dtype=torch.float64)
    assert row_scores(r, "=").tolist() == [2.0, 1.0, math.inf]
    assert row_scores(r, "<=").tolist() == [0.5, 1.0, math.inf]  # the most positive: the most violated
    assert row_scores(r, ">=").tolist() == [2.0, 0.1, math.inf]  # the least slack


def test_auto_counts_fill_the_budget_by_hand() -> None:
    """t_f = 1 s, 0.1 s a point, no Gram: a budget of 3 leaves 2 s, 20 points, 10 to each part; a pool of 4
    caps its part, the other takes 16; a cap of 12 rows (widths 1 and 2) allows 4 + 4."""
    cost = CostModel(free_s=1.0, row_s={"a": 0.1, "b": 0.1}, gram_s=0.0)
    widths = {"a": 1, "b": 1}
    shares = equal_shares(["a", "b"])
    assert auto_counts(cost, 3.0, shares, {"a": 100, "b": 100}, widths, None) == {"a": 10, "b": 10}
    assert auto_counts(cost, 3.0, shares, {"a": 4, "b": 100}, widths, None) == {"a": 4, "b": 16}
    assert auto_counts(cost, 3.0, shares, {"a": 100, "b": 100}, {"a": 1, "b": 2}, 12) == {"a": 4, "b": 4}
    # with a Gram term: 1 + 0.1 m + 0.01 m^2 <= 3 -> m = 10 (m = 11 costs 3.31)
    gram = CostModel(free_s=1.0, row_s={"a": 0.1}, gram_s=0.01)
    assert auto_counts(gram, 3.0, {"a": 1.0}, {"a": 100}, {"a": 1}, None) == {"a": 10}
    # every pool affordable whole: each whole (not one point short of it)
    two = CostModel(free_s=1.0, row_s={"a": 0.1, "b": 0.1}, gram_s=0.01)
    assert auto_counts(two, 3.0, {"a": 0.5, "b": 0.5}, {"a": 4, "b": 3}, {"a": 1, "b": 1}, None) == {"a": 4, "b": 3}


def test_the_rows_cap_is_the_largest_rank_reported_below_its_rows_and_resumes() -> None:
    """Wave1d-C's ranks as measured: 112 rows of rank 75, then 44 rows of rank 41; the cap stays 75 (the
    last rank would ratchet it down to 41, then 37, ...), and rises with a larger deficient rank. A J of
    full rank (24 rows, rank 24; 90 of 90) sets no cap and lifts none."""
    choice = RowChoice()
    assert choice.rows_cap(None, None, 0) is None
    assert choice.rows_cap(24, 24, 0) is None  # full rank: the 8-point start must be able to grow
    assert choice.rows_cap(75, 112, 0) == 75
    assert choice.rows_cap(41, 44, 0) == 75 and choice.rows_cap(None, None, 10) == 65
    assert choice.rows_cap(90, 90, 0) == 75
    assert choice.rows_cap(80, 112, 0) == 80
    resumed = RowChoice()
    resumed.load_state_dict(choice.state_dict())
    assert resumed.max_rank == 80 and resumed.rows_cap(41, 44, 0) == 80


def test_the_first_auto_choice_is_checked_after_twenty_steps_and_halved_if_its_rows_did_not_hold(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A cheap model (every count within budget, the whole pool of 101 points): the first check is due at
    step FIRST_CHECK (20), not rechoose_every (100); rows that did not come down there (1.0 -> 0.9) halve
    the count and correct no cost; the next check is rechoose_every later."""
    import lit_constrained.module_parts.row_choice as row_choice

    monkeypatch.setattr(row_choice, "measure_free", lambda task, batch, repeats=3: 1.0)
    monkeypatch.setattr(row_choice, "measure_cost", lambda task, batch, parts, widths: CostModel(1.0, {"fit": 1e-9}, 0.0))
    model = Bumps(count="auto", rechoose_every=100, lr_decay="none")
    model.constraints(None)
    choice = model.row_choice
    assert choice.rows()["fit"] == (101, 101) and choice.first_check
    assert not choice.due(FIRST_CHECK - 1) and choice.due(FIRST_CHECK) and FIRST_CHECK == 20
    for violation in (1.0, 0.95, 0.9):
        choice.observed(1.0, torch.tensor(violation))
    choice.choose(model, None, model.imposed(None), FIRST_CHECK)
    assert choice.rows()["fit"] == (50, 101) and choice.cost.corrections == 0 and not choice.first_check
    assert not choice.due(FIRST_CHECK + 99) and choice.due(FIRST_CHECK + 100)
    resumed = RowChoice()
    resumed.load_state_dict(choice.state_dict())
    assert not resumed.first_check and resumed.auto_caps == {"fit": 50}


def test_rows_that_did_not_hold_halve_the_auto_counts_and_rows_that_held_let_them_grow_back() -> None:
    """held(): max |c| at the interval's last step <= 1e-2 x max(max |c| at its first, 1); a part's cap is
    half its count after an interval that did not hold, doubled after one that held, dropped at its pool."""
    pool = torch.linspace(0, 1, 64)[:, None]
    auto = {"pde": Imposed(lambda x: x[:, 0], pool, count="auto")}
    choice = RowChoice()
    assert choice.held() is None
    choice.cost = CostModel(0.01, {"pde": 1e-3}, 0.0, corrections=SETTLING_CORRECTIONS)  # auto parts imposed: violations kept
    choice.chosen = {"pde": torch.arange(24)}
    for violation in (4.0, 3.0, 2.5):  # the newly chosen rows came down 1.6x only
        choice.observed(0.1, torch.tensor(violation))
    assert choice.held() is False
    choice._update_auto_caps(auto)
    assert choice.auto_caps == {"pde": 12}
    resumed = RowChoice()
    resumed.load_state_dict(choice.state_dict())
    assert resumed.auto_caps == {"pde": 12} and resumed.held() is False
    choice.violations = (None, None)
    choice.chosen = {"pde": torch.arange(12)}
    for violation in (4.0, 1e-3, 3e-2):  # 3e-2 <= 1e-2 x 4: held
        choice.observed(0.1, torch.tensor(violation))
    assert choice.held() is True
    choice._update_auto_caps(auto)
    assert choice.auto_caps == {"pde": 24}
    choice._update_auto_caps(auto)
    assert choice.auto_caps == {"pde": 48}
    choice._update_auto_caps(auto)  # 96 >= the pool's 64: no cap
    assert choice.auto_caps == {}
    small = RowChoice()
    small.cost = choice.cost
    small.observed(0.1, torch.tensor(1e-4))
    small.observed(0.1, torch.tensor(5e-3))  # started below 1: held below 1e-2
    assert small.held() is True


def test_a_correction_scales_the_constraint_terms_to_the_measured_step() -> None:
    cost = CostModel(free_s=1.0, row_s={"a": 0.1}, gram_s=0.0)
    corrected = cost.corrected(3.0, {"a": 10}, {"a": 1})  # predicted 2.0, measured 3.0: the rows cost 2x
    assert corrected.row_s == {"a": 0.2} and corrected.corrections == 1 and corrected.free_s == 1.0
    assert not corrected.settled and corrected.corrected(3.0, {"a": 10}, {"a": 1}).row_s == {"a": 0.2}


def test_a_count_is_checked() -> None:
    x = torch.zeros(3, 1)
    for bad in (0, -1, 2.5, "many", True):
        with pytest.raises(ValueError, match="count must be None"):
            Imposed(lambda p: p[:, 0], x, count=bad)


# -------------------------------------------------------------------------------------- a module
class Bumps(ConstrainedModule):
    """u = 0 at start (the last layer zeroed), imposed u = g at a pool of 101 points, count k: the residual
    -g has its largest values at g's two peaks (x = 0.2 and 0.7), which the first choice must take."""

    def __init__(self, count: Any = 2, **kwargs: Any) -> None:
        kwargs.setdefault("imposed_choice", "largest")  # the rule whose known best points these tests name
        super().__init__(**kwargs)
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(torch.nn.Linear(1, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
        torch.nn.init.zeros_(self.net[2].weight)
        torch.nn.init.zeros_(self.net[2].bias)
        self.register_buffer("pool", torch.linspace(0, 1, 101)[:, None])
        self.count = count

    @staticmethod
    def target(x: torch.Tensor) -> torch.Tensor:
        return 3 * torch.exp(-((x[:, 0] - 0.2) / 0.05) ** 2) + 2 * torch.exp(-((x[:, 0] - 0.7) / 0.05) ** 2)

    def objective(self, batch: Any) -> torch.Tensor:
        return (self.net(self.pool)[:, 0] - self.target(self.pool)).pow(2).mean()

    def residual(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)[:, 0] - self.target(x)

    def imposed(self, batch: Any) -> dict[str, Imposed]:
        return {"fit": Imposed(self.residual, self.pool, count=self.count)}


def _loader() -> DataLoader:
    return DataLoader([0], batch_size=None)


def test_the_first_choice_takes_the_known_worst_points_and_imposes_only_them() -> None:
    model = Bumps(count=2, rechoose_every=1000, lr_decay="none")
    assert model.constraints(None).numel() == 2  # chosen on first use
    assert model.row_choice.chosen["fit"].tolist() == [20, 70]
    quiet_trainer(max_steps=40, limit_val_batches=0).fit(model, train_dataloaders=_loader())
    assert model.row_choice.rows() == {"fit": (2, 101)}
    residual = model.residual(model.pool).detach()
    assert residual[[20, 70]].abs().max() < 1e-5  # the two imposed points hold


def test_a_re_choice_moves_the_rows_and_the_step_accepts_the_new_m() -> None:
    """After the peaks are imposed the worst points are elsewhere: the re-choice at step 5 takes others."""
    model = Bumps(count=2, rechoose_every=5, lr_decay="none")
    quiet_trainer(max_steps=6, limit_val_batches=0).fit(model, train_dataloaders=_loader())
    assert model.row_choice.chosen_at == 5 and model.row_choice.chosen["fit"].tolist() != [20, 70]


def test_spread_rows_ignore_the_residuals_and_stay_at_a_re_choice_of_the_same_count() -> None:
    """The default rule: the bumps' peaks (0.2, 0.7) are not what it takes; the centre and the ends are, and
    a re-choice of the same count on the same pool keeps them."""
    model = Bumps(count=3, rechoose_every=5, lr_decay="none", imposed_choice="spread")
    model.constraints(None)
    assert model.row_choice.chosen["fit"].tolist() == [0, 50, 100]
    quiet_trainer(max_steps=11, limit_val_batches=0).fit(model, train_dataloaders=_loader())
    assert model.row_choice.chosen_at == 10 and model.row_choice.chosen["fit"].tolist() == [0, 50, 100]


def test_auto_measures_its_cost_and_stays_within_the_pool_and_the_summary_names_it(capsys: pytest.CaptureFixture) -> None:
    model = Bumps(count="auto", rechoose_every=10)
    quiet_trainer(max_steps=22, limit_val_batches=0).fit(model, train_dataloaders=_loader())
    points, pool = model.row_choice.rows()["fit"]
    assert 1 <= points <= pool == 101
    assert model.row_choice.cost is not None and model.row_choice.cost.corrections == 1  # checked at 10, corrected at 20
    assert model.row_choice.cost.free_s > 0 and model.row_choice.cost.row_s["fit"] > 0
    assert f"imposed      fit {points} of 101 points (chosen from the pools, every 10 steps)" in capsys.readouterr().out


def test_the_correction_measures_the_free_step_again_warm(monkeypatch: pytest.MonkeyPatch) -> None:
    """t_f as the first choice read it (0.5 s, injected) and as the correction reads it (0.25 s): the settled
    model keeps the second, and its rows are scaled against it (measured steps of 1 s: every constraint term
    scaled by (1 - 0.25) over what the first model predicted for them at the counts imposed)."""
    import lit_constrained.module_parts.row_choice as row_choice

    free_times = iter([0.5, 0.25])
    monkeypatch.setattr(row_choice, "measure_free", lambda task, batch, repeats=3: next(free_times))
    model = Bumps(count="auto", rechoose_every=10, lr_decay="none")
    model.constraints(None)  # the first choice: the probe's model, t_f = 0.5
    first = model.row_choice.cost
    assert first.free_s == 0.5 and not first.settled
    model.row_choice.first_check = False  # (the first check corrects nothing: its own test)
    counts = {"fit": int(model.row_choice.chosen["fit"].numel())}
    for _ in range(5):
        model.row_choice.observed(1.0, None)  # the steps since, as the module's clock would report them: 1 s each
    model.row_choice.choose(model, None, model.imposed(None), 10)
    settled = model.row_choice.cost
    assert settled.corrections == 1 and settled.free_s == 0.25
    predicted = first.step_s(counts, {"fit": 1}) - first.free_s
    assert settled.row_s["fit"] == pytest.approx(first.row_s["fit"] * (1.0 - 0.25) / predicted)


def test_the_model_is_corrected_at_the_first_three_re_choices_and_kept_after(monkeypatch: pytest.MonkeyPatch) -> None:
    """Steps of 1 s, then 0.5 s, then 0.4 s, then 9 s (injected; t_f 0.25 s): each of the first three
    corrections makes the model predict the interval just measured at its counts; the fourth interval's
    steps change nothing (the model is settled: the counts depend on nothing measured after)."""
    import lit_constrained.module_parts.row_choice as row_choice

    monkeypatch.setattr(row_choice, "measure_free", lambda task, batch, repeats=3: 0.25)
    model = Bumps(count="auto", rechoose_every=10, lr_decay="none")
    model.constraints(None)
    model.row_choice.first_check = False  # (the first check corrects nothing: its own test)
    for step, seconds in zip((10, 20, 30), (1.0, 0.5, 0.4)):
        counts = {"fit": int(model.row_choice.chosen["fit"].numel())}
        for _ in range(5):
            model.row_choice.observed(seconds, None)
        model.row_choice.choose(model, None, model.imposed(None), step)
        assert model.row_choice.cost.step_s(counts, {"fit": 1}) == pytest.approx(seconds)
    assert model.row_choice.cost.settled and model.row_choice.cost.corrections == SETTLING_CORRECTIONS == 3
    kept, counts = model.row_choice.cost, model.row_choice.rows()["fit"]
    for _ in range(5):
        model.row_choice.observed(9.0, None)
    model.row_choice.choose(model, None, model.imposed(None), 40)
    assert model.row_choice.cost == kept and model.row_choice.rows()["fit"] == counts


def _fit_to(directory: Path, steps: int, resume: bool, count: Any = "auto") -> Bumps:
    from lit_constrained.callbacks.checkpointing import CrashSafeCheckpoint

    model = Bumps(count=count, rechoose_every=4, lr_decay="none")
    trainer = quiet_trainer(max_steps=steps, limit_val_batches=0, enable_checkpointing=True,
                            callbacks=[CrashSafeCheckpoint(dirpath=str(directory))])
    trainer.fit(model, train_dataloaders=_loader(), ckpt_path="last" if resume else None)
    return model


def test_resume_with_auto_rows_is_bit_exact(tmp_path: Path) -> None:
    """A run stopped at step 18 (its first rows checked at step 4, its cost model corrected at steps 8, 12 and 16,
    settled), resumed to 28 twice from the same
    checkpoint: bit-identical (the rows, the counts' cost model and the choice step come from the
    checkpoint; nothing measured after the settling enters the choice)."""
    _fit_to(tmp_path, 18, resume=False)
    saved = torch.load(tmp_path / "last.ckpt", weights_only=True)
    assert saved[CHECKPOINT_KEY]["cost"]["corrections"] == SETTLING_CORRECTIONS and saved[CHECKPOINT_KEY]["chosen_at"] == 16
    (tmp_path / "copy").mkdir()
    (tmp_path / "copy" / "last.ckpt").write_bytes((tmp_path / "last.ckpt").read_bytes())
    first = _fit_to(tmp_path, 28, resume=True)
    second = _fit_to(tmp_path / "copy", 28, resume=True)
    assert first.row_choice.chosen["fit"].tolist() == second.row_choice.chosen["fit"].tolist()
    for (name, a), b in zip(first.state_dict().items(), second.state_dict().values()):
        assert torch.equal(a, b), name


def test_resume_with_re_chosen_rows_equals_the_uninterrupted_run(tmp_path: Path) -> None:
    """count = 3 (no timing in the choice): 10 steps, resumed to 20, against 20 steps in one go (re-choices at
    0, 4, 8, 12, 16)."""
    (tmp_path / "whole").mkdir()
    whole = _fit_to(tmp_path / "whole", 20, resume=False, count=3)
    _fit_to(tmp_path, 10, resume=False, count=3)
    resumed = _fit_to(tmp_path, 20, resume=True, count=3)
    assert resumed.row_choice.chosen_at == whole.row_choice.chosen_at == 16
    assert resumed.row_choice.chosen["fit"].tolist() == whole.row_choice.chosen["fit"].tolist()
    for (name, a), b in zip(whole.state_dict().items(), resumed.state_dict().values()):
        assert torch.equal(a, b), name


# ------------------------------------------------------------------------------------------- DDP
def _rank_choice(rank: int, world: int, port: int, out: str) -> None:
    import torch.distributed as dist

    from lit_constrained.module_parts.row_choice import _rank_zeros, _same_on_every_rank

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        mine = {"pde": torch.tensor([rank, rank + 3, rank + 7]), "bc": torch.arange(rank + 1)}  # differ per rank
        got = {name: t.tolist() for name, t in _same_on_every_rank(mine, shared=True).items()}
        # each rank's pool is its own shard: the points and their data imposed are rank 0's
        points, data = _rank_zeros(torch.full((3, 2), float(rank)), {"n": torch.full((3, 2), rank + 10.0)}, True)
        got["points"], got["data"] = points.tolist(), data["n"].tolist()
        torch.save(got, f"{out}.{rank}")
    finally:
        dist.destroy_process_group()


def test_under_ddp_every_rank_imposes_rank_zeros_choice(tmp_path: Path) -> None:
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    context = mp.start_processes(_rank_choice, args=(2, port, str(tmp_path / "choice")), nprocs=2, join=False,
                                 start_method="spawn")
    deadline = 100.0
    import time

    start = time.monotonic()
    while not context.join(timeout=5):
        if time.monotonic() - start > deadline:
            for process in context.processes:
                process.kill()
            pytest.fail("the ranks did not finish within 100 s (a deadlock)")
    choices = [torch.load(tmp_path / f"choice.{rank}") for rank in (0, 1)]
    assert choices[0] == choices[1] == {"pde": [0, 3, 7], "bc": [0], "points": [[0.0, 0.0]] * 3,
                                        "data": [[10.0, 10.0]] * 3}


def test_a_part_given_no_points_is_left_out() -> None:
    assert spread_largest(torch.zeros(5, 2), torch.ones(5), 0).tolist() == []


class BumpsWithData(Bumps):
    """The same part with its target handed as per-point data (each pool point's own g): the choice
    must cut the data with the points, so the chosen rows still read u(x_i) - g_i."""

    def residual_of_data(self, x: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        return self.net(x)[:, 0] - g

    def imposed(self, batch: Any) -> dict[str, Imposed]:
        return {"fit": Imposed(self.residual_of_data, self.pool, count=self.count, data=self.target(self.pool))}


def test_the_chosen_points_keep_their_own_data() -> None:
    """The same choice, the same c and the same J as the part whose residual computes g itself, and the
    same trajectory over 10 steps (float64 weights: constraint_dtype changes nothing)."""
    torch.manual_seed(0)
    plain, with_data = Bumps(count=2, lr_decay="none").double(), BumpsWithData(count=2, lr_decay="none").double()
    with_data.load_state_dict(plain.state_dict())
    c_plain, c_data = plain.constraints(None), with_data.constraints(None)
    assert with_data.row_choice.chosen["fit"].tolist() == plain.row_choice.chosen["fit"].tolist() == [20, 70]
    torch.testing.assert_close(c_data, c_plain, rtol=0, atol=0)
    params = list(plain.parameters())
    torch.testing.assert_close(with_data.constraint_jacobian(None, c_data, list(with_data.parameters())),
                               plain.constraint_jacobian(None, c_plain, params))
    for model in (plain, with_data):
        quiet_trainer(max_steps=10, limit_val_batches=0).fit(model, train_dataloaders=_loader())
    for (name, a), b in zip(plain.state_dict().items(), with_data.state_dict().values()):
        torch.testing.assert_close(a, b, msg=name)


def test_between_re_choices_the_chosen_points_are_kept_when_the_pool_changes() -> None:
    """A pool that moves (a mini-batch) between re-choices: the step keeps imposing the points chosen,
    not whatever lies at their indices in the new pool."""
    model = Bumps(count=2, rechoose_every=1000, lr_decay="none")
    model.constraints(None)
    chosen = model.pool[[20, 70]].clone()
    model.pool = torch.flip(model.pool, dims=[0]).clone()  # the same size: no re-choice
    parts = model.row_choice.apply(model, None, model.imposed(None))
    assert torch.equal(parts["fit"].points, chosen)


def test_the_chosen_points_follow_a_float64_evaluation_of_the_weights() -> None:
    """The end-of-fit floors evaluate c with the weights and the points cast to float64: the kept points
    follow (they were chosen in float32), so c_64 is the residual at the chosen points by hand in float64."""
    from lit_constrained.module_parts.constraint_precision import constraints_at, evaluation_floor

    model = Bumps(count=2, constraint_dtype="native", lr_decay="none")
    model.constraints(None)  # chosen in float32
    c64 = constraints_at(model, None, torch.float64)
    x = model.pool[[20, 70]].double()
    net = model.net.double()
    by_hand = (net(x)[:, 0] - Bumps.target(x)).detach()
    model.net.float()
    assert c64.dtype == torch.float64
    torch.testing.assert_close(c64, by_hand, rtol=0, atol=1e-15)
    assert 0 < evaluation_floor(model, None) < 1e-5  # float32 c against float64 c: float32 rounding


def test_the_cost_clock_is_the_process_cpu_time_on_a_cpu() -> None:
    """On a CPU the cost model and the steps it is checked against read the process's CPU time (a sleep,
    which another job's load resembles from this process's side, costs it nothing); elsewhere wall time."""
    import time

    from lit_constrained.module_parts.row_choice import cost_clock

    assert cost_clock(torch.device("cpu")) is time.process_time and cost_clock(None) is time.process_time
    assert cost_clock(torch.device("meta")) is time.perf_counter
    clock = cost_clock(torch.device("cpu"))
    start = clock()
    time.sleep(0.2)
    assert clock() - start < 0.05

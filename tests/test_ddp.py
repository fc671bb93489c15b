"""Two CPU processes (gloo): the DDP path of ConstrainedModule with every optimizer of the package.

One fork/spawn of 2 workers trains the float64 ``ShardTask`` of ``tests.helpers.ddp`` with each optimizer in
turn (``Trainer(strategy="ddp", devices=2)``, 3 epochs of 2 steps, validation every epoch, a checkpoint
every epoch). Each rank trains on its own rows (Lightning's DistributedSampler); the 3 constraint
points are the same on every rank. The parent process then

* checks that both replicas hold bit-identical weights after every step (no drift);
* reruns each optimizer in one process on the union of the ranks' batches and compares every step;
* recomputes the logged train and validation metrics independently (a hand-written forward pass of
  the network at the recorded weights, on the union of the data);
* shows that MoMo's step depends on the loss value and that the loss it used is the rank mean;
* resumes every 2-process checkpoint (end of epoch 1) in a 1-process run and continues.
"""

from __future__ import annotations

import math
import multiprocessing
import warnings
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from tests.helpers import ddp as helpers

pytestmark = pytest.mark.ddp

NAMES = list(helpers.OPTIMIZERS)
STEPS = helpers.EPOCHS * helpers.STEPS_PER_EPOCH
HIDDEN = 6  # ShardTask's default width


@pytest.fixture(scope="module")
def ddp(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Both ranks' records of the 2-process runs (one start of 2 processes for all optimizers)."""
    out = tmp_path_factory.mktemp("ddp")
    # fork starts the workers in a fraction of a second (spawn re-imports torch and Lightning: ~10 s
    # each on a loaded 2-core machine); fork is unsafe only once this process holds a process group
    fork = "fork" in multiprocessing.get_all_start_methods() and not dist.is_initialized()
    mp.start_processes(
        helpers.worker,
        args=(helpers.free_port(), str(out)),
        nprocs=helpers.WORLD,
        join=True,
        start_method="fork" if fork else "spawn",
    )
    ranks = [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(helpers.WORLD)]
    return {"ranks": ranks, "dir": out}


@pytest.fixture(scope="module")
def single() -> dict[str, dict[str, Any]]:
    """The 1-process runs on the union of the ranks' batches."""
    return {name: helpers.run_single(name) for name in NAMES}


VARIANTS = [(variant, name) for variant, names in helpers.VARIANT_RUNS.items() for name in names]


@pytest.fixture(scope="module")
def single_variants() -> dict[tuple[str, str], dict[str, Any]]:
    """The 1-process references of the variant runs (m = 1; per-rank constraints on the union)."""
    return {key: helpers.run_single(key[1], variant=key[0]) for key in VARIANTS}


# ---------------------------------------------------------------------------- independent re-computation


def _forward(flat: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """The 2 -> HIDDEN -> 1 tanh network at the flat weights [W1, b1, W2, b2], written out by hand."""
    h = HIDDEN
    w1 = flat[: 2 * h].reshape(h, 2)
    b1 = flat[2 * h : 3 * h]
    w2 = flat[3 * h : 4 * h].reshape(1, h)
    b2 = flat[4 * h : 4 * h + 1]
    assert flat.numel() == 4 * h + 1
    return (torch.tanh(x @ w1.T + b1) @ w2.T + b2).squeeze(-1)


def _anchor_residuals(flat: torch.Tensor) -> torch.Tensor:
    x = torch.tensor([[0.1, 0.2], [0.5, -0.3], [-0.4, 0.7]], dtype=torch.float64)
    exact = torch.sin(2.0 * x[:, 0]) * torch.cos(x[:, 1])
    return _forward(flat, x) - exact


def _union_batches(epoch: int) -> list[torch.Tensor]:
    """Row indices of the global batches of an epoch: a seeded permutation, cut in 2*BATCH rows."""
    perm = torch.randperm(helpers.N_TRAIN, generator=torch.Generator().manual_seed(helpers.SEED + epoch))
    size = helpers.WORLD * helpers.BATCH
    return [perm[j * size : (j + 1) * size] for j in range(helpers.STEPS_PER_EPOCH)]


def _weights_before(run: dict[str, Any], step: int) -> torch.Tensor:
    return run["start"]["params"] if step == 0 else run["steps"][step - 1]["params"]


def _logged(run: dict[str, Any], key: str) -> list[tuple[int, float]]:
    return [(step, metrics[key]) for step, metrics in run["logs"] if key in metrics]


def _step_counters(state: Any) -> list[int]:
    """Every 'step' / 'k' counter found in an optimizer state dict."""
    found: list[int] = []
    if isinstance(state, dict):
        for key, value in state.items():
            if key in ("step", "k") and not isinstance(value, dict):
                found.append(int(value))
            else:
                found += _step_counters(value)
    return found


def _metrics_by_step(run: dict[str, Any]) -> dict[tuple[int, str], float]:
    return {(step, key): value for step, metrics in run["logs"] for key, value in metrics.items()}


def _rel(key: str) -> float:
    """Relative tolerance of a logged value: 1e-12 for the float64 quantities; 1e-9 for the optimizer
    diagnostics (multipliers and singular values solve with J J^T, whose conditioning amplifies the
    round-off of the two runs' different summation orders); 1e-6 for the violation metrics' float32
    states."""
    if key.count("/") >= 2:
        return 1e-6
    return 1e-9 if key.startswith("optim/") else 1e-12


def _linearized_roundoff_bound(metrics: dict[tuple[int, str], float], step: int, m: int) -> float:
    """What round-off alone can make of ``optim/linearized_feasibility_error`` = ||J d + s c|| / (s ||c||)
    at ``step`` (d the step, s its scale), from the same step's logged norms.

    In exact arithmetic J d_n = -s c and J d_t = 0 (d = d_n + d_t, normal and tangential). Forming J d
    (n terms a row) errs by at most about n eps ||J||_F ||d|| <= n eps sqrt(m) ||J||_2 (||d_n|| + ||d_t||),
    while s ||c|| = ||J d_n|| >= sigma_min ||d_n||: at most n eps sqrt(m) kappa (1 + ||d_t|| / ||d_n||), with
    kappa = ||J||_2 / sigma_min = sqrt(gram_condition) (1 when it is not charted, a constant: m = 1).
    """
    n = 4 * HIDDEN + 1
    kappa = math.sqrt(metrics.get((step, "optim/gram_condition"), 1.0))
    normal = metrics[(step, "optim/normal_step_norm")]
    tangential = metrics[(step, "optim/tangential_step_norm")]
    return n * torch.finfo(torch.float64).eps * math.sqrt(m) * kappa * (1.0 + tangential / normal)


# ---------------------------------------------------------------------------- the tests


def test_two_ranks_trained_on_different_rows(ddp: dict[str, Any]) -> None:
    rank0, rank1 = ddp["ranks"]
    for name in NAMES:
        assert (rank0[name]["world_size"], rank0[name]["global_rank"]) == (2, 0)
        assert (rank1[name]["world_size"], rank1[name]["global_rank"]) == (2, 1)
        assert len(rank0[name]["steps"]) == len(rank1[name]["steps"]) == STEPS, name
        local0 = [s["local_objective"] for s in rank0[name]["steps"]]
        local1 = [s["local_objective"] for s in rank1[name]["steps"]]
        assert all(abs(a - b) > 1e-3 for a, b in zip(local0, local1)), name  # different data per rank


@pytest.mark.parametrize("name", NAMES)
def test_replicas_stay_bit_identical(ddp: dict[str, Any], name: str) -> None:
    rank0, rank1 = (r[name] for r in ddp["ranks"])
    assert torch.equal(rank0["start"]["params"], rank1["start"]["params"])
    for step, (a, b) in enumerate(zip(rank0["steps"], rank1["steps"])):
        assert torch.equal(a["params"], b["params"]), f"{name}: replicas differ after step {step}"
        assert torch.equal(a["constraints"], b["constraints"]), name
        assert a["objective"] == b["objective"], name
    moved = (rank0["steps"][-1]["params"] - rank0["start"]["params"]).abs().max()
    assert moved > 1e-3, name  # the weights did change


@pytest.mark.parametrize("name", NAMES)
def test_two_processes_equal_one_process_on_the_union(
    ddp: dict[str, Any], single: dict[str, dict[str, Any]], name: str
) -> None:
    run, ref = ddp["ranks"][0][name], single[name]
    assert len(ref["steps"]) == STEPS
    torch.testing.assert_close(run["start"]["params"], ref["start"]["params"], rtol=0, atol=0)
    for step, (a, b) in enumerate(zip(run["steps"], ref["steps"])):
        torch.testing.assert_close(a["params"], b["params"], rtol=0, atol=1e-12, msg=f"{name} step {step}")
        torch.testing.assert_close(a["constraints"], b["constraints"], rtol=0, atol=1e-12)
    if name == "constant_step_adam":  # LipschitzEstimator: alpha from L(w0) and L_hat over all ranks' data
        assert run["alpha"] == pytest.approx(ref["alpha"], rel=1e-12)
        assert run["start"]["lr"] == run["alpha"]


@pytest.mark.parametrize("name", NAMES)
def test_logged_train_metrics_are_those_of_the_union(
    ddp: dict[str, Any], single: dict[str, dict[str, Any]], name: str
) -> None:
    rank0, rank1 = (r[name] for r in ddp["ranks"])
    x, y = helpers.train_set().tensors
    batches = [rows for epoch in range(helpers.EPOCHS) for rows in _union_batches(epoch)]
    for run in (rank0, rank1):  # every rank logs the same (already reduced) values
        objective = _logged(run, "Objective/train")
        train_logs = {step: metrics for step, metrics in run["logs"] if "Objective/train" in metrics}
        assert [s for s, _ in objective] == list(range(STEPS))
        for step, (_, value) in enumerate(objective):
            w = _weights_before(run, step)
            rows = batches[step]
            union = (_forward(w, x[rows]) - y[rows, 0]).pow(2).mean()
            assert value == pytest.approx(float(union), rel=1e-12, abs=1e-14), f"{name} step {step}"
            local_mean = 0.5 * (rank0["steps"][step]["local_objective"] + rank1["steps"][step]["local_objective"])
            assert value == pytest.approx(local_mean, rel=1e-12), f"{name} step {step}"
            c = _anchor_residuals(w).abs()
            logs = train_logs[step]
            assert logs["Violation/train"] == pytest.approx(float(c.max()), rel=1e-12)
            # ConstraintViolationMonitor (float32 metric states)
            assert logs["Violation/train/max"] == pytest.approx(float(c.max()), rel=1e-6)
            assert logs["Violation/train/mean"] == pytest.approx(float(c.mean()), rel=1e-6)
            assert logs["Violation/train/l1"] == pytest.approx(float(c.sum()), rel=1e-6)
            assert logs["Violation/train/l2"] == pytest.approx(float(c.norm()), rel=1e-6)
            c0 = _anchor_residuals(run["start"]["params"]).norm()
            assert logs["Violation/train/relative"] == pytest.approx(float(c.norm() / c0), rel=1e-6)
    ref = dict((s, v) for s, v in _logged(single[name], "Objective/train"))
    assert [v for _, v in _logged(rank0, "Objective/train")] == pytest.approx([ref[s] for s in range(STEPS)], rel=1e-10)


@pytest.mark.parametrize("name", NAMES)
def test_validation_metrics_are_exact_over_the_whole_validation_set(
    ddp: dict[str, Any], single: dict[str, dict[str, Any]], name: str
) -> None:
    x, y = helpers.val_set().tensors
    keys = ("Objective/val", "residual/val", "residual/val/max", "residual/val/mean",
            "residual/val/l1", "residual/val/l2", "residual/val/relative")
    for run in (*(r[name] for r in ddp["ranks"]), single[name]):
        # the validation at the start (step 0, written directly: no "epoch") is at the initial weights
        (start,) = [m for s, m in run["logs"] if "Objective/val" in m and "epoch" not in m]
        r = _forward(run["start"]["params"], x) - y[:, 0]
        assert start["Objective/val"] == pytest.approx(float(r.pow(2).mean()), rel=1e-10), name
        assert start["residual/val"] == pytest.approx(float(r.abs().max()), rel=1e-10), name
        records = [(s, m) for s, m in run["logs"] if "Objective/val" in m and "epoch" in m]
        assert len(records) == helpers.EPOCHS, name
        r0 = None
        for epoch, (_, metrics) in enumerate(records):
            assert metrics["epoch"] == epoch
            w = run["steps"][(epoch + 1) * helpers.STEPS_PER_EPOCH - 1]["params"]  # after the epoch's last step
            r = _forward(w, x) - y[:, 0]  # residual at all N_VAL rows (each rank saw half)
            r0 = r.norm() if r0 is None else r0
            a = r.abs()
            assert metrics["Objective/val"] == pytest.approx(float(r.pow(2).mean()), rel=1e-10), name
            assert metrics["residual/val"] == pytest.approx(float(a.max()), rel=1e-10), name
            assert metrics["Violation/val"] == pytest.approx(float(_anchor_residuals(w).abs().max()), rel=1e-10), name
            assert metrics["residual/val/max"] == pytest.approx(float(a.max()), rel=1e-6), name
            assert metrics["residual/val/mean"] == pytest.approx(float(a.mean()), rel=1e-6), name
            assert metrics["residual/val/l1"] == pytest.approx(float(a.sum()), rel=1e-6), name
            assert metrics["residual/val/l2"] == pytest.approx(float(r.norm()), rel=1e-6), name
            assert metrics["residual/val/relative"] == pytest.approx(float(r.norm() / r0), rel=1e-6), name
        assert set(keys) <= set(records[-1][1]), name


@pytest.mark.parametrize("name", ["momo", "momo_adam"])
def test_momo_steps_with_the_rank_mean_loss(
    ddp: dict[str, Any], single: dict[str, dict[str, Any]], name: str
) -> None:
    rank0, rank1 = (r[name] for r in ddp["ranks"])
    lr = helpers.OPTIMIZERS[name].keywords["lr"]
    taus = []
    for step, (a, b, ref) in enumerate(zip(rank0["steps"], rank1["steps"], single[name]["steps"])):
        assert abs(a["local_objective"] - b["local_objective"]) > 1e-3  # the ranks' losses differ ...
        assert torch.equal(a["params"], b["params"])  # ... their weights do not
        assert a["momo"] == b["momo"] and a["momo_group"] == b["momo_group"], step
        # the loss average and f* equal those of the 1-process run, whose loss is the union mean
        for key in ("loss_avg", "gamma", "lower_bound"):
            assert a["momo"][key] == pytest.approx(ref["momo"][key], rel=1e-10, abs=1e-14), (step, key)
        taus.append(a["momo_tau"])
    # the adaptive (loss-dependent) branch of tau = min(lr, ...) was active, so the loss mattered
    assert min(taus) < 0.5 * lr


def test_without_the_reduce_of_the_loss_momo_replicas_would_drift(ddp: dict[str, Any]) -> None:
    """One MoMo step on each rank from the same weights and the same all-reduced gradient."""
    r0, r1 = (r["momo_without_reduce"] for r in ddp["ranks"])
    assert float(r0["local_loss"]) != pytest.approx(float(r1["local_loss"]), rel=1e-3)
    assert torch.equal(r0["mean_loss"], r1["mean_loss"])
    assert float(r0["mean_loss"]) == pytest.approx(0.5 * float(r0["local_loss"] + r1["local_loss"]), rel=1e-14)
    # the rank-mean loss (what TrainingStepper passes) keeps the replicas identical ...
    assert torch.equal(r0["with_mean_loss"], r1["with_mean_loss"])
    # ... each rank's own loss would not: different step sizes, different weights
    assert float(r0["with_own_loss_tau"]) != pytest.approx(float(r1["with_own_loss_tau"]), rel=1e-3)
    assert (r0["with_own_loss"] - r1["with_own_loss"]).abs().max() > 1e-3


@pytest.mark.parametrize("name", NAMES)
def test_resume_a_two_process_checkpoint_in_one_process(ddp: dict[str, Any], name: str) -> None:
    run = ddp["ranks"][0][name]
    ckpt = ddp["dir"] / "ckpt" / name / f"epoch={helpers.RESUME_EPOCH}.ckpt"
    assert ckpt.is_file(), sorted(p.name for p in ckpt.parent.iterdir())
    resumed = helpers.run_single(name, ckpt_path=str(ckpt))
    saved_step = (helpers.RESUME_EPOCH + 1) * helpers.STEPS_PER_EPOCH

    start = resumed["start"]
    assert start["global_step"] == saved_step
    assert torch.equal(start["params"], run["steps"][saved_step - 1]["params"])  # the saved weights
    counters = _step_counters(start["optimizer_state"])
    assert counters and set(counters) == {saved_step}, counters  # the saved optimizer state
    if name == "constant_step_adam":  # the estimator is not rerun: its alpha comes from the checkpoint
        assert start["lr"] == run["alpha"]

    # it continues the 2-process trajectory: with reset moments / counters the steps would differ
    assert [s["global_step"] for s in resumed["steps"]] == list(range(saved_step + 1, STEPS + 1))
    for a, b in zip(resumed["steps"], run["steps"][saved_step:]):
        torch.testing.assert_close(a["params"], b["params"], rtol=1e-10, atol=1e-12)
    assert not math.isnan(resumed["steps"][-1]["objective"])


def test_a_resume_with_fresh_optimizer_state_would_differ(ddp: dict[str, Any]) -> None:
    """Control for the resume test: SQP-Adam from the saved weights but a new optimizer."""
    run = ddp["ranks"][0]["sqp_adam"]
    ckpt = ddp["dir"] / "ckpt" / "sqp_adam" / f"epoch={helpers.RESUME_EPOCH}.ckpt"
    saved_step = (helpers.RESUME_EPOCH + 1) * helpers.STEPS_PER_EPOCH
    task = helpers.ShardTask.load_from_checkpoint(str(ckpt), weights_only=False)
    trainer = helpers.make_trainer(helpers.callbacks_for("sqp_adam"), devices=1, max_steps=1)
    train, _ = helpers.loaders(world=1)
    # the same next batch: the sampler of epoch RESUME_EPOCH + 1
    train.sampler.set_epoch(helpers.RESUME_EPOCH + 1)
    rows = list(train.sampler)[: helpers.WORLD * helpers.BATCH]
    x, y = helpers.train_set().tensors
    batch = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x[rows], y[rows]), batch_size=len(rows))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(task, train_dataloaders=batch)
    fresh = helpers.flat_params(task)
    continued = run["steps"][saved_step]["params"]
    assert (fresh - continued).abs().max() > 1e-6


# ---------------------------------------------------------------------------- the row-sharded Jacobian


@pytest.mark.parametrize("name", NAMES)
def test_each_rank_differentiates_only_its_share_of_the_rows(
    ddp: dict[str, Any], single: dict[str, dict[str, Any]], name: str
) -> None:
    """m = 3 shared rows over 2 ranks: rank 0 differentiates rows 0:2, rank 1 row 2:3 (one process: all 3)."""
    calls = [r[name]["jacobian_rows"] for r in ddp["ranks"]]
    if name not in helpers.JACOBIAN_OPTIMIZERS:  # the optimizer needs no J: none is computed
        assert calls == [[], []] and single[name]["jacobian_rows"] == []
        return
    assert calls[0] == [(3, 0, 2)] * STEPS and calls[1] == [(3, 2, 3)] * STEPS
    assert single[name]["jacobian_rows"] == [(3, 0, 3)] * STEPS


@pytest.mark.parametrize("variant,name", VARIANTS)
def test_variant_two_processes_equal_one_process(
    ddp: dict[str, Any], single_variants: dict[tuple[str, str], dict[str, Any]], variant: str, name: str
) -> None:
    """m = 1 < 2 ranks (rank 1 differentiates no row), and per-rank constraints (the union of the
    ranks' rows, 4, as one process imposes on the union batch): bit-identical replicas, the 1-process
    weights, constraints and logged metrics at every step."""
    rank0, rank1 = (r[(variant, name)] for r in ddp["ranks"])
    ref = single_variants[(variant, name)]
    m = {"one_anchor": 1, "per_rank": helpers.WORLD * helpers.PER_RANK_ROWS}[variant]
    assert len(rank0["steps"]) == len(ref["steps"]) == STEPS
    for step, (a, b, r) in enumerate(zip(rank0["steps"], rank1["steps"], ref["steps"])):
        assert torch.equal(a["params"], b["params"]) and torch.equal(a["constraints"], b["constraints"])
        assert a["constraints"].numel() == r["constraints"].numel() == m
        torch.testing.assert_close(a["params"], r["params"], rtol=0, atol=1e-12, msg=f"{variant} {name} step {step}")
        torch.testing.assert_close(a["constraints"], r["constraints"], rtol=0, atol=1e-12)
    moved = (rank0["steps"][-1]["params"] - rank0["start"]["params"]).abs().max()
    assert moved > 1e-3
    for step, (a, r) in enumerate(zip(rank0["steps"], ref["steps"])):
        assert a["objective"] == pytest.approx(r["objective"], rel=1e-12), step
    # every metric the logger received: the same keys at the same steps, the same values
    logged, logged_ref = _metrics_by_step(rank0), _metrics_by_step(ref)
    assert sorted(logged) == sorted(logged_ref)
    for key, value in logged.items():
        if key[1] == "optim/linearized_feasibility_error":
            # round-off alone, divided by s ||c||, and the corrections bring ||c|| to ~1e-9 here: the
            # two runs' summation orders give unrelated values (e.g. 0 and 5e-10 at one step), so each
            # run's value is held to the round-off bound, not to the other run's
            for metrics in (logged, logged_ref):
                assert metrics[key] <= _linearized_roundoff_bound(metrics, key[0], m), (key, metrics[key])
            continue
        assert value == pytest.approx(logged_ref[key], rel=_rel(key[1]), abs=1e-14), key
    if name in helpers.JACOBIAN_OPTIMIZERS:
        rows = {"one_anchor": [[(1, 0, 1)], [(1, 1, 1)]], "per_rank": [[(2, 0, 2)], [(2, 0, 2)]]}[variant]
        assert [rank0["jacobian_rows"], rank1["jacobian_rows"]] == [r * STEPS for r in rows]


def test_per_rank_constraints_are_those_of_each_ranks_own_batch(ddp: dict[str, Any]) -> None:
    """The gathered c (4 rows) is rank 0's two rows then rank 1's, each at that rank's own batch:
    recomputed by hand at the weights before the step, from the sampler's permutation."""
    run = ddp["ranks"][0][("per_rank", "sqp_adam")]
    x, _ = helpers.train_set().tensors
    batches = [rows for epoch in range(helpers.EPOCHS) for rows in _union_batches(epoch)]
    for step, record in enumerate(run["steps"][:-1]):
        w = run["steps"][step]["params"]  # c logged at step+1 is evaluated at the weights after step
        rows = batches[step + 1]
        points = torch.cat([x[rows[r::helpers.WORLD][: helpers.PER_RANK_ROWS]] for r in range(helpers.WORLD)])
        exact = torch.sin(2.0 * points[:, 0]) * torch.cos(points[:, 1])
        expected = _forward(w, points) - exact
        torch.testing.assert_close(run["steps"][step + 1]["constraints"], expected, rtol=1e-12, atol=1e-14)
        del record


def test_constraints_differing_across_ranks_while_declared_shared_are_refused(ddp: dict[str, Any]) -> None:
    for rank in ddp["ranks"]:
        message = rank["shared_flag_wrong"]
        assert "differs across ranks" in message and "constraints_shared = False" in message, message


@pytest.mark.parametrize("name", NAMES)
def test_every_logged_metric_equals_the_one_process_run(
    ddp: dict[str, Any], single: dict[str, dict[str, Any]], name: str
) -> None:
    """The row-sharded 2-process run logs the same keys at the same steps as the 1-process run on the
    union, with the same values (1e-12 for float64 quantities; see ``_rel``)."""
    logged, logged_ref = _metrics_by_step(ddp["ranks"][0][name]), _metrics_by_step(single[name])
    assert sorted(logged) == sorted(logged_ref)
    for key, value in logged.items():
        assert value == pytest.approx(logged_ref[key], rel=_rel(key[1]), abs=1e-14), key

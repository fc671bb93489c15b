"""The comparison grid: methods, the paper's settings per task, and the list of runs.

A run is one point of task x method x rho variant x learning rate x batch mode x seed. The paper
(2601.11795, section 5) compares four methods at two learning rates per task, full batch (one run)
and mini-batch (mean and standard deviation over 5 seeds), with :math:`\\beta = 0.9`,
:math:`(\\beta_1, \\beta_2) = (0.9, 0.999)`, :math:`\\epsilon = 10^{-7}`, :math:`h = 1` and a fixed
:math:`\\rho` per task (:data:`TASKS`).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Union

RhoValue = Union[float, str, None]


@dataclass(frozen=True)
class Method:
    """An optimizer in the comparison.

    Attributes:
        label: the paper's name (figure legends, tables).
        class_path: the optimizer class (``model.init_args.optimizer.class_path`` of the run config).
        init_args: the paper's hyper-parameters besides lr and rho (used when the task has no config
            file for this method and the optimizer is swapped into another method's config).
        constrained: whether it imposes the constraints (takes rho).
    """

    label: str
    class_path: str
    init_args: dict[str, Any] = field(default_factory=dict)
    constrained: bool = True


_BETAS = [0.9, 0.999]

#: The four methods of the paper, keyed by their config file stem (configs/<task>/<key>.yaml).
METHODS: dict[str, Method] = {
    # (max_corrections 0: the papers' algorithms, without the package's post-step corrections)
    "sqp_adam": Method("SQP-Adam(con)", "lit_constrained.optim.SQPAdam",
                       {"betas": _BETAS, "eps": 1e-7, "h": 1.0, "max_corrections": 0}),
    "sqp_heavyball": Method("SQP-HeavyBall(con)", "lit_constrained.optim.SQPHeavyBall",
                            {"beta": 0.9, "h": 1.0, "max_corrections": 0}),
    "adam_con": Method("Adam(con)", "lit_constrained.optim.AdamCon", {"betas": _BETAS, "eps": 1e-7, "max_corrections": 0}),
    "adam_unc": Method("Adam(unc)", "torch.optim.Adam", {"betas": _BETAS, "eps": 1e-7}, constrained=False),
}


@dataclass(frozen=True)
class TaskGrid:
    """The paper's grid for one task.

    Attributes:
        lrs: the two learning rates of the paper.
        rho: the paper's rho per method key (``"*"``: every constrained method not named).
        test_metric: the ``val/<name>`` metric reported as the test error.
        batch_modes: whether the task's DataModule has ``batch_mode`` (full / minibatch).
        budget_note: where the task's reference epoch budget (``trainer.max_epochs`` of its paper
            config, see :func:`lit_constrained.compare.configs.config_budget`) comes from. The paper's
            text states no epoch budget for any task.
        figure: the paper's figure of the task's loss curves ("" when the paper has none).
    """

    lrs: tuple[float, ...]
    rho: dict[str, float]
    test_metric: str
    batch_modes: bool = True
    budget_note: str = ""
    figure: str = ""

    def paper_rho(self, method: str) -> float:
        return self.rho.get(method, self.rho.get("*", 1.0))


_NO_BUDGET = "The paper's text states no epoch budget; "

TASKS: dict[str, TaskGrid] = {
    "spring": TaskGrid(
        lrs=(5e-4, 1e-4), rho={"*": 1.0}, test_metric="mse", figure="Figure 1",
        budget_note=_NO_BUDGET + "10 000 epochs (configs/spring/paper/), at which SQP-Adam(con) has converged "
        "(objective ~1e-6 at lr 5e-4) while the 500-epoch grid has not.",
    ),
    "chemistry": TaskGrid(
        lrs=(5e-4, 1e-4), rho={"*": 0.5}, test_metric="mse", figure="Figure 3",
        budget_note=_NO_BUDGET + "1 000 epochs (configs/chemistry/paper/: 1 000 initial conditions, "
        "mini-batch 20 % = 5 steps per epoch, no normalization).",
    ),
    "burgers": TaskGrid(
        lrs=(1e-3, 5e-4), rho={"*": 1.0}, test_metric="rel_l2", figure="Figure 4",
        budget_note=_NO_BUDGET + "1 000 epochs (configs/burgers/paper/: 100 initial conditions), chosen as "
        "the paper configs' placeholder.",
    ),
    "darcy": TaskGrid(
        lrs=(5e-3, 1e-3), rho={"sqp_heavyball": 1.0, "sqp_adam": 0.5, "*": 1.0}, test_metric="rel_l2",
        figure="Figure 7",
        budget_note=_NO_BUDGET + "1 000 epochs (configs/darcy/paper/: FNO with 16 x 16 modes, "
        "mini-batch 20 % = 5 steps per epoch).",
    ),
    # not a paper problem: the package's minimal example (fast; used by the tests)
    "curve": TaskGrid(lrs=(1e-2, 1e-3), rho={"*": 1.0}, test_metric="mse", batch_modes=False,
                      budget_note="Not a paper problem: the budget of configs/curve/sqp_adam.yaml."),
    # not a paper problem: 2D Poisson (PINA's problem zoo), the PDE and u = 0 imposed at 25 + 25 points
    "poisson": TaskGrid(lrs=(1e-3, 1e-4), rho={"*": 1.0}, test_metric="rel_l2",
                        budget_note="Not a paper problem: the budget of configs/poisson/sqp_adam.yaml."),
}


def task_grid(task: str) -> TaskGrid:
    """The grid of a known task; an unknown task gets a generic one (lrs 1e-3, 1e-4; rho 1)."""
    return TASKS.get(task, TaskGrid(lrs=(1e-3, 1e-4), rho={"*": 1.0}, test_metric="mse",
                                    budget_note="Not a paper problem: the budget of the task's config."))


@dataclass(frozen=True)
class Budget:
    """The epoch budget of a comparison and its fraction of the reference (the paper configs') budget.

    Attributes:
        epochs: the epochs each run trains for.
        reference_epochs: the paper's budget (``trainer.max_epochs`` of the task's paper config).
        source: the config the reference budget was read from.
        size: ``"paper"`` (the paper configs' problem size) or ``"embedded"`` (the small default configs).
    """

    epochs: int
    reference_epochs: int
    source: str
    size: str = "paper"

    @property
    def fraction(self) -> float:
        return self.epochs / self.reference_epochs

    @property
    def text(self) -> str:
        """E.g. ``budget fraction 0.05 (500 of 10000 epochs), paper size``."""
        return (f"budget fraction {format(self.fraction, '.3g')} ({self.epochs} of {self.reference_epochs} epochs), "
                f"{self.size} size")

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "fraction": self.fraction}


def resolve_budget(reference_epochs: int, source: str, size: str, max_epochs: int | None = None,
                   fraction: float | None = None) -> Budget:
    """The run budget: ``max_epochs`` when given, else ``round(fraction * reference_epochs)`` (at least 1)."""
    if max_epochs is not None and fraction is not None:
        raise ValueError("Give --max-epochs or --budget-fraction, not both.")
    if max_epochs is not None:
        if max_epochs < 1:
            raise ValueError(f"--max-epochs must be >= 1, got {max_epochs}.")
        return Budget(max_epochs, reference_epochs, source, size)
    fraction = 1.0 if fraction is None else fraction
    if not (math.isfinite(fraction) and fraction > 0):
        raise ValueError(f"--budget-fraction must be a number > 0, got {fraction}.")
    return Budget(max(1, round(fraction * reference_epochs)), reference_epochs, source, size)


def parse_rho(text: str) -> str:
    """A rho variant: ``paper`` (the task's published rho), ``full`` (rho_k = 1/lr_k) or a number > 0."""
    text = text.strip()
    if text in ("paper", "full"):
        return text
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"--rho entries must be 'paper', 'full' or a number > 0, got {text!r}.") from None
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"--rho numbers must be finite and > 0, got {text!r}.")
    return format(value, "g")


def lr_text(lr: float) -> str:
    return format(lr, "g")


@dataclass(frozen=True)
class RunSpec:
    """One run of the grid (JSON-serializable: it travels to the worker process)."""

    task: str
    method: str
    rho_variant: str  # "paper" | "full" | a number; "-" for unconstrained methods
    rho: RhoValue  # the value given to the optimizer (None: unconstrained)
    lr: float
    mode: str  # "full" | "minibatch" | "default" (the task's DataModule has no batch modes)
    seed: int
    max_epochs: int

    @property
    def name(self) -> str:
        """A readable, file-safe run name, e.g. ``sqp_adam_lr0.0005_minibatch_seed3``."""
        variant = "" if self.rho_variant in ("paper", "-") else f"_rho{self.rho_variant}"
        return f"{self.method}{variant}_lr{lr_text(self.lr)}_{self.mode}_seed{self.seed}"

    @property
    def label(self) -> str:
        """The method's legend label (with the rho variant when it is not the paper's)."""
        label = METHODS[self.method].label if self.method in METHODS else self.method
        return label if self.rho_variant in ("paper", "-") else f"{label} rho={self.rho_variant}"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "RunSpec":
        return cls(**{k: data[k] for k in cls.__dataclass_fields__})


def build_grid(
    task: str,
    methods: list[str],
    lrs: list[float],
    modes: list[str],
    rho_variants: list[str],
    full_seeds: int,
    minibatch_seeds: int,
    max_epochs: int,
    seed_offset: int = 0,
) -> list[RunSpec]:
    """Every run of the grid, in a stable order (unconstrained methods once, whatever the rho variants)."""
    grid = task_grid(task)
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise ValueError(f"Unknown method(s) {unknown}: choose from {sorted(METHODS)}.")
    if not lrs or any(not (math.isfinite(lr) and lr > 0) for lr in lrs):
        raise ValueError(f"Learning rates must be finite and > 0, got {lrs}.")
    if max_epochs < 1:
        raise ValueError(f"--max-epochs must be >= 1, got {max_epochs}.")
    if full_seeds < 0 or minibatch_seeds < 0:
        raise ValueError("--full-seeds and --minibatch-seeds must be >= 0.")
    for mode in modes:
        if mode not in ("full", "minibatch"):
            raise ValueError(f"Batch modes are 'full' and 'minibatch', got {mode!r}.")
    if not grid.batch_modes:
        modes = ["default"]
    runs: list[RunSpec] = []
    for method in methods:
        constrained = METHODS[method].constrained
        variants = list(dict.fromkeys(rho_variants)) if constrained else ["-"]
        for variant in variants:
            if variant == "-":
                rho: RhoValue = None
            elif variant == "paper":
                rho = grid.paper_rho(method)
            elif variant == "full":
                rho = "full"
            else:
                rho = float(variant)
            for lr in lrs:
                for mode in modes:
                    count = minibatch_seeds if mode == "minibatch" else full_seeds
                    for seed in range(seed_offset, seed_offset + count):
                        runs.append(RunSpec(task, method, variant, rho, float(lr), mode, seed, max_epochs))
    if not runs:
        raise ValueError("The grid is empty: check --methods, --lrs, --modes and the seed counts.")
    return runs


def execution_order(runs: list[RunSpec]) -> list[RunSpec]:
    """The order runs are started in: what a partial grid can already report comes first.

    Full-batch runs (one seed) first, then the mini-batch runs; within a batch mode the paper's rho
    (and the unconstrained method) before the other rho variants, and then seed by seed, so a grid
    stopped early has every method of the paper's setting at the same seeds.
    """
    mode_rank = {"full": 0, "default": 0, "minibatch": 1}
    position = {id(spec): i for i, spec in enumerate(runs)}
    variant_rank = {"paper": 0, "-": 0}
    return sorted(
        runs,
        key=lambda s: (mode_rank.get(s.mode, 2), variant_rank.get(s.rho_variant, 1), s.seed, position[id(s)]),
    )

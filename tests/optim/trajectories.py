"""Trajectories of every optimizer class of ``lit_constrained.optim``, recorded by one source tree and
compared bit for bit with another's (a script, not a test: run it against two checkouts).

It uses only the public API (construct, ``step``, ``state_dict``, ``load_state_dict``), so the same file
records the trajectories of an older checkout and of today's::

    mkdir /tmp/orig && git archive <commit> lit_constrained tests/helpers tests/__init__.py \\
        benchmarks/hock_schittkowski.py | tar -x -C /tmp/orig
    PYTHONPATH=/tmp/orig python tests/optim/trajectories.py record /tmp/old.pt
    python tests/optim/trajectories.py compare /tmp/old.pt

``record`` writes, per case, the parameters after each of ``STEPS`` steps and the optimizer's
``state_dict`` (and the parameters) after step ``SAVE_AT``. ``compare`` runs the same cases here and checks
(1) every step's parameters with ``torch.equal``, (2) that this tree's own checkpoint at ``SAVE_AT``,
loaded into a fresh optimizer, continues bit for bit, and (3) what the recorded tree's checkpoint does
when loaded here: it continues bit for bit (converted) or is refused with a one-line message; both are
printed. The cases: a small smooth problem of three parameters (two equality rows for the constrained
optimizers; float64 and float32, two param groups, a parameter without grad on odd steps, a complex
parameter), a small tanh network with per-point equality rows (the tasks' shape: native precision and
``precision="float64"``, the default safeguard and the post-step corrections), and the Hock-Schittkowski
problems with inequality rows (``tests/helpers/hs_inequality.py``, the benchmark's settings).
"""

from __future__ import annotations

import io
import math
import os
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

ROOT = Path(os.environ.get("PYTHONPATH", "").split(os.pathsep)[0] or Path(__file__).resolve().parents[2])
"""The source tree whose ``lit_constrained`` runs: the first PYTHONPATH entry, else this checkout."""
sys.path.insert(0, str(ROOT))
sys.path.insert(1, str(ROOT / "benchmarks"))

from lit_constrained.jacobians import real_view  # noqa: E402
from lit_constrained.optim import (  # noqa: E402
    AdamCon, ConstantStepAdam, MoMo, MoMoAdam, SQPAdam, SQPHeavyBall,
)
from lit_constrained.optim.experimental import SQPMoMo, SQPMoMoAdam  # noqa: E402

STEPS = 30
SAVE_AT = 15
CONSTRAINED = (SQPHeavyBall, SQPAdam, AdamCon, SQPMoMo, SQPMoMoAdam)
KWARGS: dict[type, dict[str, Any]] = {
    SQPHeavyBall: dict(lr=0.05, momentum=0.8, rho=0.5, h=1.5),
    SQPAdam: dict(lr=0.05, betas=(0.8, 0.99), eps=1e-6, rho=0.5, h=1.5),
    AdamCon: dict(lr=0.05, betas=(0.8, 0.99), eps=1e-6, rho=0.5),
    MoMo: dict(lr=0.5, momentum=0.8, weight_decay=0.01, lower_bound=-0.1, estimate_lower_bound=True),
    MoMoAdam: dict(lr=0.1, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.01, estimate_lower_bound=True),
    ConstantStepAdam: dict(lr=0.05, betas=(0.8, 0.99), eps=1e-6),
    SQPMoMo: dict(lr=0.5, momentum=0.8, lower_bound=-0.1, estimate_lower_bound=True, rho=0.5),
    SQPMoMoAdam: dict(lr=0.1, betas=(0.8, 0.99), eps=1e-6, estimate_lower_bound=True, rho=0.5),
}
SECOND_GROUP: dict[type, dict[str, Any]] = {
    SQPHeavyBall: dict(lr=0.01, momentum=0.3, h=3.0), SQPAdam: dict(lr=0.01, betas=(0.5, 0.9), eps=1e-1),
    AdamCon: dict(lr=0.01, betas=(0.5, 0.9)), MoMo: dict(lr=1e-2, weight_decay=0.5),
    MoMoAdam: dict(lr=1e-3, eps=1e-1, decoupled_weight_decay=True), ConstantStepAdam: dict(lr=0.01, bias_correction=True),
    SQPMoMo: dict(lr=1e-2), SQPMoMoAdam: dict(lr=1e-3, eps=1e-1),
}


@dataclass
class Case:
    """One trajectory: how to build the parameters and the optimizer, and one step."""

    name: str
    build: Callable[[], tuple[list[Tensor], Any]]
    """(parameters, a function params -> optimizer)"""
    step: Callable[[Any, list[Tensor], int], None]
    """(optimizer, parameters, k): one step k (gradients, rows, ``optimizer.step``, a scheduler's step)"""


# ---------------------------------------------------------------------------- the smooth problem


def _small_params(dtype: torch.dtype, complex_: bool) -> list[Tensor]:
    gen = torch.Generator().manual_seed(0)
    out = []
    for shape in [(3, 2), (3,), (4,)]:
        if complex_:
            values = torch.view_as_complex(torch.randn(*shape, 2, generator=gen, dtype=torch.float64))
            out.append(torch.nn.Parameter(values))  # complex128
        else:
            out.append(torch.nn.Parameter(torch.randn(shape, generator=gen, dtype=torch.float64).to(dtype)))
    return out


def _small_step(cls: type, no_grad: bool) -> Callable[[Any, list[Tensor], int], None]:
    def step(opt: Any, params: list[Tensor], k: int) -> None:
        opt.zero_grad()
        target = 0.3 * math.sin(k + 1)
        loss = sum((0.5 * (real_view(p) - target) ** 2 + 0.05 * real_view(p) ** 4).sum() for p in params)
        loss.backward()
        if no_grad and k % 2:
            params[1].grad = None
        kwargs: dict[str, Any] = {}
        if cls in CONSTRAINED:
            x = torch.cat([real_view(p.detach()).reshape(-1) for p in params])
            a = torch.cos(torch.arange(x.numel(), dtype=x.dtype))
            kwargs["constraints"] = torch.stack([0.5 * (x @ x - 0.25 * x.numel()), a @ x + 0.1 * (x**3).sum() - 0.2])
            kwargs["jacobian"] = torch.stack([x, a + 0.3 * x**2])
        value = loss.detach()
        opt.step(lambda: value, **kwargs)
    return step


def _small_case(cls: type, dtype: torch.dtype = torch.float64, groups: bool = False, no_grad: bool = False,
                complex_: bool = False, **extra: Any) -> Case:
    def build() -> tuple[list[Tensor], Any]:
        params = _small_params(dtype, complex_)

        def make(ps: list[Tensor]) -> Any:
            given: Any = [{"params": ps[:2]}, {"params": ps[2:], **SECOND_GROUP[cls]}] if groups else ps
            return cls(given, **{**KWARGS[cls], **extra})
        return params, make
    tags = [str(dtype).split(".")[-1]] + ["groups"] * groups + ["no_grad"] * no_grad + ["complex"] * complex_
    tags += [f"{k}={v}" for k, v in extra.items()]
    return Case(f"small/{cls.__name__}/{'-'.join(tags)}", build, _small_step(cls, no_grad))


# ---------------------------------------------------------------------------- a tanh network with per-point rows


def _network_case(cls: type, **extra: Any) -> Case:
    points = torch.linspace(-1.0, 1.0, 4).reshape(-1, 1)
    inputs = torch.linspace(-1.0, 1.0, 16).reshape(-1, 1)

    def build() -> tuple[list[Tensor], Any]:
        torch.manual_seed(0)
        net = torch.nn.Sequential(torch.nn.Linear(1, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
        params = list(net.parameters())
        kwargs = dict(lr=1e-2) if cls is ConstantStepAdam else dict(lr=1e-2) if cls in (MoMoAdam, SQPMoMoAdam, SQPAdam, AdamCon) else {}
        return params, lambda ps: cls(ps, **{**kwargs, **extra})

    def forward(flat_params: list[Tensor], x: Tensor) -> Tensor:
        w1, b1, w2, b2 = flat_params
        return (torch.tanh(x @ w1.T + b1) @ w2.T + b2).reshape(-1)

    def rows(params: list[Tensor]) -> tuple[Tensor, Tensor]:
        values = [p.detach() for p in params]
        c = forward(values, points) - torch.sin(3 * points.reshape(-1))
        jac = torch.func.jacrev(lambda *ps: forward(list(ps), points), argnums=tuple(range(4)))(*values)
        J = torch.cat([j.reshape(points.shape[0], -1) for j in jac], dim=1)
        return c.detach(), J.detach()

    def step(opt: Any, params: list[Tensor], k: int) -> None:
        opt.zero_grad()
        loss = ((forward(params, inputs) - torch.cos(2 * inputs.reshape(-1))) ** 2).mean()
        loss.backward()
        value = loss.detach()
        if cls in CONSTRAINED:
            c, J = rows(params)
            opt.step(lambda: value, constraints=c, jacobian=J, constraint_closure=lambda: rows(params)[0])
        else:
            opt.step(lambda: value)

    tags = "-".join(f"{k}={v}" for k, v in extra.items()) or "default"
    return Case(f"network/{cls.__name__}/{tags}", build, step)


# ---------------------------------------------------------------------------- Hock-Schittkowski


def _hs_case(problem: Any, optimizer: str) -> Case:
    from hock_schittkowski import OPTIMIZERS, evaluate, settings

    def build() -> tuple[list[Tensor], Any]:
        x = torch.nn.Parameter(torch.tensor(problem.x0, dtype=torch.float64))
        return [x], lambda ps: OPTIMIZERS[optimizer](ps, **settings(problem.name, optimizer))

    def step(opt: Any, params: list[Tensor], k: int) -> None:
        x = params[0]
        for group in opt.param_groups:  # lr decaying linearly to 0 over the benchmark's 4 000 steps
            group["lr"] = group.setdefault("initial_lr", group["lr"]) * (1.0 - k / 4000)
        opt.zero_grad()
        problem.objective(x).backward()
        c, J, g, G = evaluate(problem, x)
        opt.step(constraints=c, jacobian=J, inequalities=g, inequality_jacobian=G)

    return Case(f"hs/{problem.name}/{optimizer}", build, step)


def cases() -> list[Case]:
    from tests.helpers.hs_inequality import PROBLEMS

    out = []
    for cls in KWARGS:
        out += [_small_case(cls), _small_case(cls, torch.float32), _small_case(cls, groups=True),
                _small_case(cls, no_grad=True), _small_case(cls, complex_=True)]
        out.append(_network_case(cls))
    for cls in (SQPHeavyBall, SQPAdam, AdamCon):
        out += [_small_case(cls, rho="full"), _small_case(cls, torch.float32, precision="float64"),
                _network_case(cls, precision="float64")]
    out.append(_small_case(MoMo, bias_correction=True, estimate_lower_bound=False))
    out.append(_small_case(SQPMoMoAdam, geometry="euclidean"))
    out += [_hs_case(problem, name) for problem in PROBLEMS for name in ("SQPAdam", "SQPHeavyBall")]
    return out


# ---------------------------------------------------------------------------- running


def _flat(params: list[Tensor]) -> Tensor:
    return torch.cat([real_view(p.detach()).reshape(-1).to(torch.float64) for p in params])


def _serialized(value: Any) -> bytes:
    buffer = io.BytesIO()
    torch.save(value, buffer)
    return buffer.getvalue()


def _loaded(data: bytes) -> Any:
    return torch.load(io.BytesIO(data), weights_only=False)


def run(case: Case, start: tuple[bytes, bytes] | None = None) -> tuple[Tensor, bytes | None, bytes | None]:
    """The parameters after each step (rows SAVE_AT.. when ``start`` = (parameters, state_dict) resumes
    there) and, for a run from step 0, the checkpoint after step SAVE_AT."""
    params, make = case.build()
    opt = make(params)
    first = 0
    if start is not None:
        with torch.no_grad():
            for p, saved in zip(params, _loaded(start[0])):
                p.copy_(saved)
        opt.load_state_dict(_loaded(start[1]))
        first = SAVE_AT
    rows, saved_params, saved_state = [], None, None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for k in range(first, STEPS):
            case.step(opt, params, k)
            rows.append(_flat(params))
            if k + 1 == SAVE_AT and start is None:
                saved_params = _serialized([p.detach().clone() for p in params])
                saved_state = _serialized(opt.state_dict())
    return torch.stack(rows), saved_params, saved_state


def record(path: str) -> None:
    out = {}
    for case in cases():
        trajectory, saved_params, saved_state = run(case)
        out[case.name] = {"trajectory": trajectory, "params": saved_params, "state": saved_state}
    torch.save(out, path)
    import lit_constrained

    print(f"{lit_constrained.__file__}: recorded {len(out)} cases ({STEPS} steps each) into {path}")


def compare(path: str) -> int:
    recorded = torch.load(path, weights_only=False)
    failures = 0
    converted = refused = 0
    for case in cases():
        old = recorded.get(case.name)
        if old is None:
            print(f"{case.name}: not recorded")
            failures += 1
            continue
        trajectory, saved_params, saved_state = run(case)
        same = trajectory.shape == old["trajectory"].shape and torch.equal(trajectory, old["trajectory"])
        resumed, _, _ = run(case, (saved_params, saved_state))
        resumes = torch.equal(resumed, trajectory[SAVE_AT:])
        try:
            from_old, _, _ = run(case, (old["params"], old["state"]))
            old_checkpoint = "continues" if torch.equal(from_old, old["trajectory"][SAVE_AT:]) else "DIFFERS"
            converted += old_checkpoint == "continues"
        except ValueError as error:
            message = str(error)
            old_checkpoint = f"refused ({message})" if "\n" not in message else "refused (multi-line message)"
            refused += 1
        ok = same and resumes and old_checkpoint != "DIFFERS" and "multi-line" not in old_checkpoint
        failures += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {case.name}: trajectory {'bit-identical' if same else 'DIFFERS'}, "
              f"resume {'bit-identical' if resumes else 'DIFFERS'}, old checkpoint {old_checkpoint}")
    import lit_constrained

    print(f"{lit_constrained.__file__} against {path}: {len(recorded)} cases, {failures} failed; old checkpoints: {converted} continue, {refused} refused")
    return 1 if failures else 0


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("record", "compare"):
        raise SystemExit(__doc__)
    if sys.argv[1] == "record":
        record(sys.argv[2])
    else:
        raise SystemExit(compare(sys.argv[2]))

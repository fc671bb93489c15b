"""Hints that name the fix, for the mistakes of a first day with the package.

Each function returns the words that an error or warning adds to what went wrong: which setting,
argument or helper fixes it. The Lightning layer (:mod:`lit_constrained.module`,
:mod:`lit_constrained.stepping`) and the command line attach them to the exception raised in the
user's code (:func:`add_hint`: the original exception, its type and traceback kept, the hint appended
as a note), so the message a user reads ends with the fix.

The bottom of the house: this module imports nothing of the package (and neither torch nor Lightning
at import; :func:`describe_batch` imports torch when it runs), so every layer may use it, the
optimizers included (:mod:`lit_constrained.optim.checks` takes its wording of the derivative fix from
here). The hints that must read the package's classes live with what uses them: an optimizer's
arguments in :mod:`lit_constrained.module_parts.optimizer_arguments`, the command line's in
:mod:`lit_constrained.cli.fit.hints`.
"""

from __future__ import annotations

import inspect
import os
import sys
from collections.abc import Mapping
from typing import Any

SECOND_BACKWARD = "backward through the graph a second time"
"""Part of torch's message when a ``torch.autograd.grad`` call without ``create_graph=True`` freed a
graph that a later derivative (or the Jacobian) needs."""

NO_GRAPH = "does not require grad and does not have a grad_fn"
"""Part of torch's message for a derivative of a tensor with no graph behind it: the result of an
earlier ``torch.autograd.grad`` call without ``create_graph=True`` (the first derivative of a Laplacian
taken so, then differentiated again), or points that do not require grad."""

DERIVATIVE_FIX = (
    "A residual with derivatives with respect to the inputs needs create_graph=True in EVERY "
    "torch.autograd.grad call it makes (for a Laplacian: the first derivative AND each second "
    "derivative): a call without it frees the graph the next derivative needs and leaves the result "
    "without its dependence on the weights, which the constraint Jacobian differentiates; the points it "
    "differentiates with respect to need requires_grad_(True). Or use the "
    "operators of lit_constrained.physics (partial, gradient, laplacian, divergence, time_derivative, "
    "derivatives), which need no create_graph: e.g. laplacian(lambda x: self.net(x)[:, 0], x)."
)
"""The fix for a derivative taken without ``create_graph=True`` (see :data:`SECOND_BACKWARD`)."""


class SetupError(ValueError):
    """A setting that cannot work, found before the first step, whose message names the fix (the
    Trainer's gradient clipping, fp16 precision, a missing callback, ...). ``lit-constrained`` prints it
    as one line, ``lit-constrained <subcommand>: error: <message>``, with exit status 2, as it does
    argument errors: the traceback would only show where the check is made. In Python it is the
    ``ValueError`` it subclasses."""


def add_hint(error: BaseException, hint: str) -> BaseException:
    """``error`` with ``hint`` appended to what it prints (a note, Python >= 3.11; the message itself
    before), so that re-raising it (``raise``) keeps its type and traceback. Returns ``error``."""
    if sys.version_info >= (3, 11):
        error.add_note(hint)
    elif error.args and isinstance(error.args[0], str):
        error.args = (f"{error.args[0]}\n{hint}", *error.args[1:])
    else:
        error.args = (*error.args, hint)
    return error


def is_derivative_without_graph(error: BaseException) -> bool:
    """Whether ``error`` is torch's error for a derivative with respect to the inputs that has no graph
    to go through, without :data:`DERIVATIVE_FIX` attached yet: "backward through the graph a second
    time" (:data:`SECOND_BACKWARD`: a later call of a residual forgot ``create_graph=True``) or "element 0
    of tensors does not require grad and does not have a grad_fn" (:data:`NO_GRAPH`: the first call
    forgot it, or the points do not require grad) raised in a ``torch.autograd.grad`` call (the same
    words from ``backward()`` mean an objective that does not depend on the weights)."""
    import traceback

    if DERIVATIVE_FIX in getattr(error, "__notes__", ()):
        return False
    text = str(error)
    if SECOND_BACKWARD in text:
        return True
    return NO_GRAPH in text and any(
        frame.f_code.co_name == "grad" and "autograd" in frame.f_code.co_filename
        for frame, _ in traceback.walk_tb(error.__traceback__))


def describe_batch(batch: Any, depth: int = 0) -> str:
    """What a batch is, in words: ``"a tuple of 2: Tensor (64, 1) float32, Tensor (64, 1) float32"``,
    ``"a dict with keys 'x' (Tensor (51, 2) float32), 'u' (...)"``, ``"Tensor (51, 1) float32"``."""
    from torch import Tensor  # here: the command line imports this module before torch

    if isinstance(batch, Tensor):
        return f"Tensor {tuple(batch.shape)} {str(batch.dtype).removeprefix('torch.')}"
    if depth >= 2:
        return type(batch).__name__
    if isinstance(batch, Mapping):
        items = ", ".join(f"{key!r} ({describe_batch(value, depth + 1)})" for key, value in list(batch.items())[:8])
        more = f" and {len(batch) - 8} more" if len(batch) > 8 else ""
        return f"a dict with keys {items}{more}"
    if isinstance(batch, (list, tuple)):
        items = ", ".join(describe_batch(value, depth + 1) for value in list(batch)[:6])
        more = f", ... ({len(batch)} in all)" if len(batch) > 6 else ""
        return f"a {type(batch).__name__} of {len(batch)}: {items}{more}"
    return type(batch).__name__ if batch is not None else "None"


def evaluation_hook_hint(task: str, hook: str, stage: str, batch: Any, train_batch: str | None) -> str:
    """The hint for an error raised in ``task.hook(batch)`` on a validation or test batch."""
    seen = f"; the training batches were {train_batch}" if train_batch else ""
    stage_name = "validation" if stage == "val" else stage
    return (
        f"{task}.{hook}() failed on a {stage_name} batch. ConstrainedModule evaluates objective() and "
        f"constraints() (and validation_constraints(), evaluation_metrics()) on every validation and test "
        f"batch too, to log Objective/{stage} and Violation/{stage}, and once before training (step 0). "
        f"This {stage_name} batch is {describe_batch(batch)}{seen}. Give the {stage} DataLoader batches of "
        f"the form the training batches have, or make objective() and constraints() accept this form too."
    )


def init_arguments(cls: type) -> list[str]:
    """The keyword arguments ``cls(...)`` takes after its first positional one (an optimizer's params)."""
    try:
        parameters = list(inspect.signature(cls).parameters.values())
    except (TypeError, ValueError):
        return []
    names = [p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    return names[1:] if names and names[0] in ("params", "parameters") else names


def argument_message(name: str, argument: str, accepted: list[str], takers: list[str]) -> str:
    """"<name> takes no '<argument>' (did you mean '<the nearest accepted>'?); its arguments are ...;
    '<argument>' is an argument of <takers>"."""
    import difflib

    where = (f" {argument!r} is an argument of {', '.join(takers)} (e.g. class_path: {takers[0]})."
             if takers else "")
    close = difflib.get_close_matches(argument, accepted, n=1)
    nearest = f" (did you mean {close[0]!r}?)" if close else ""
    return f"{name} takes no {argument!r}{nearest}; its arguments are {', '.join(accepted)}.{where}"


def unexpected_keyword(error: BaseException) -> str | None:
    """The argument name of a ``TypeError: ... got an unexpected keyword argument 'x'`` (else None)."""
    text = str(error)
    marker = "unexpected keyword argument '"
    if not isinstance(error, TypeError) or marker not in text:
        return None
    return text.split(marker, 1)[1].split("'", 1)[0]


def task_kwargs_hint(task: type, argument: str) -> str:
    """The hint for a task whose ``__init__`` does not pass ``argument`` (an option of
    ConstrainedModule) on: it must accept ``**kwargs`` and hand them to ``ConstrainedModule``."""
    return (
        f"{task.__name__}.__init__ does not accept {argument!r}, an argument of ConstrainedModule (optimizer, "
        "lr_scheduler, num_threads, max_grad_norm, ...). A task's __init__ must accept **kwargs and pass them "
        f"on: def __init__(self, ..., **kwargs): super().__init__(**kwargs)."
    )


def one_row_loader_hint(rows: int) -> str:
    """The warning for a training DataLoader that gives one row per step by DataLoader's default."""
    return (
        f"The training DataLoader gives ONE row per step: batch_size=1 (DataLoader's default) over a "
        f"TensorDataset of {rows} rows, so objective() and constraints() see a single point at each step. "
        "For full-batch training (every row at every step) pass the whole batch as one item: "
        "DataLoader([dataset.tensors], batch_size=None), or use lit_constrained.tasks.datamodule.RowDataModule "
        "(batch_mode='full'); for mini-batches set batch_size (with drop_last=True when constraints() comes "
        "from the batch). If one row per step is what you want, pass a sampler or batch_sampler of your own."
    )


def not_imposed_hint(optimizer: str, penalty_weight: float) -> str:
    """The warning for a task with constraints trained by an optimizer that does not impose them."""
    how = (
        f"penalized (penalty_weight={penalty_weight:g} adds penalty_weight * mean(c^2) to the objective)"
        if penalty_weight > 0 else "monitored"
    )
    return (
        f"{optimizer} does not impose constraints (it steps on the objective alone): this task's constraints() "
        f"are {how}, not imposed (Violation/train and Violation/val only report them). To impose them, use "
        "a constrained optimizer of lit_constrained.optim: SQPAdam (the default), SQPHeavyBall or AdamCon "
        "(or the experimental SQPMoMo / SQPMoMoAdam of lit_constrained.optim.experimental)."
    )


def nothing_to_impose_hint(optimizer: str, task: str) -> str:
    """The warning for a hard-constrained optimizer given a task that declares no constraints."""
    return (
        f"{optimizer} imposes constraints, and {task} declares none (neither imposed() nor constraints()): it "
        "trains on the objective alone, with nothing to impose. To impose constraints, define imposed() "
        "(named parts, e.g. {'ode': Imposed(self.ode_residual, self.t_ode)}) or constraints() (the residuals c, "
        "shape (m,)); to train without any, use an unconstrained optimizer: optimizer: {class_path: "
        "torch.optim.Adam} in the config, optimizer=torch.optim.Adam in Python."
    )


def no_constraints_given_hint(optimizer: str) -> str:
    """The warning of a hard-constrained optimizer whose ``step()`` was given nothing to impose (no
    constraints, no inequalities): e.g. under a plain LightningModule's automatic optimization."""
    return (
        f"{optimizer}.step() was given no constraints (constraints=None, jacobian=None): it steps on the "
        "objective alone, imposing nothing. The constraints and their Jacobian come from the caller: train a "
        "lit_constrained.ConstrainedModule that defines imposed() or constraints() (a plain LightningModule's "
        "automatic optimization passes none), or in a loop of your own call step(constraints=c, jacobian=J); "
        "with nothing to impose, use an unconstrained optimizer such as torch.optim.Adam."
    )


#: set (to anything non-empty) to see the traceback of the package's own validation errors
TRACEBACK_VARIABLE = "LIT_CONSTRAINED_TRACEBACK"

#: the exception types the package's validation raises (``Imposed``, ``optim.checks``, non-finite values,
#: ``MissingCheckpointError``, a FileNotFoundError); one is the package's only when its code raised it
PACKAGE_VALIDATION_ERRORS = (ValueError, TypeError, FileNotFoundError, FloatingPointError)

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


def is_package_validation_error(error: BaseException) -> bool:
    """Whether ``error`` is one of :data:`PACKAGE_VALIDATION_ERRORS` raised by a check of this package: its
    innermost frame is in ``lit_constrained/`` and no other exception caused it (the command line prints
    such an error as one line)."""
    if not isinstance(error, PACKAGE_VALIDATION_ERRORS) or error.__cause__ is not None or error.__context__ is not None:
        return False
    tb = error.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is not None and os.path.abspath(tb.tb_frame.f_code.co_filename).startswith(_PACKAGE_DIR + os.sep)

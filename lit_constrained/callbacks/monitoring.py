"""What :class:`~lit_constrained.module.ConstrainedModule` writes to its loggers: the names tasks, the
command line and older code import from here.

Each now lives in the module of its concern, below the callbacks (so that both the callbacks and the
module use them without importing each other):

* the tag families and the TensorBoard layout: :mod:`lit_constrained.module_parts.tags` (what each
  ``Objective/``, ``Violation/``, ``residual/``, ``optim/``, ``Log10/`` tag means);
* writing to the loggers, figures, the HParams columns, the command line's default logger:
  :mod:`lit_constrained.module_parts.tensorboard`;
* which diagnostics are charted: :mod:`lit_constrained.module_parts.varying`;
* whether an optimizer imposes the constraints: :mod:`lit_constrained.module_parts.trainer_checks`.
"""

from __future__ import annotations

from lit_constrained.module_parts.tags import (
    DIAGNOSTICS, FIGURE, LOG10, OBJECTIVE, REDUNDANT_DIAGNOSTICS, RESIDUAL, VIOLATION, headline_tags, part_tag,
    scalar_layout, tag,
)
from lit_constrained.module_parts.tensorboard import (
    default_logger, log_figure, next_version, run_hparams, run_name, small_figure, tensorboard_writers,
    write_scalars, write_summary, write_text,
)
from lit_constrained.module_parts.trainer_checks import imposes_constraints
from lit_constrained.module_parts.varying import VaryingScalars

__all__ = [
    "OBJECTIVE", "VIOLATION", "RESIDUAL", "DIAGNOSTICS", "FIGURE", "LOG10", "tag", "part_tag", "headline_tags", "scalar_layout",
    "run_hparams", "VaryingScalars", "tensorboard_writers", "write_scalars", "write_summary", "log_figure",
    "REDUNDANT_DIAGNOSTICS", "write_text", "small_figure", "run_name", "next_version", "default_logger",
    "imposes_constraints",
]

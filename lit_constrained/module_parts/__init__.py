"""The pieces :class:`~lit_constrained.module.ConstrainedModule` wires together, one concern each.

The module itself keeps what a task declares and the Lightning hooks; each hook hands its work to one
of these modules:

=========================  ===========================================================================
:mod:`.declarations`       what the task's class declares against the module's defaults (``imposed()``,
                           its own ``constraints()``) and which Jacobian the default one computes
:mod:`.imposed_rows`       the rows the ``imposed()`` parts make: their layout in c, the rows' signs, the
                           parts' per-point Jacobian
:mod:`.optimizer_specs`    the optimizer and LR scheduler given: the specs the hyper-parameters store,
                           their factories, the optimizer built
:mod:`.step_services`      the ``StepServices`` a training step gets from Lightning
:mod:`.tags`               the names of what is logged (``Objective/<stage>``, ``Violation/<stage>``, ...)
:mod:`.tensorboard`        writing to the loggers outside Lightning's cadence: scalars at a step, the
                           HParams and Custom Scalars summaries, images, text; the CLI's default logger
:mod:`.varying`            which optimizer diagnostics are charted (those that vary)
:mod:`.step_logging`       what one training step logs, and the step Lightning logs it at
:mod:`.evaluation`         one validation/test batch: f, c, the residual, the task's metrics
:mod:`.validation_pass`    the validation batches as Lightning feeds them; the pass at the initial weights
:mod:`.trainer_checks`     Trainer settings and start-of-training states that cannot work, and why
:mod:`.schedulers`         when the LR schedulers step (manual optimization leaves it to the module)
:mod:`.checkpoint_trust`   what a checkpoint may hold: finite weights written, trusted class paths read
                           (``TrustedLoading``: the module's ``load_from_checkpoint``)
=========================  ===========================================================================

None of them imports :mod:`lit_constrained.callbacks`, :mod:`lit_constrained.module` or a task, so that
callbacks can use them too (docs/ARCHITECTURE.md, "Import rules"). This package imports nothing on
import; import the module you need.
"""

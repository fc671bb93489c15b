"""The ``lit-constrained`` command: LightningCLI over ConstrainedModule subclasses and DataModules.

``lit-constrained fit --config configs/<task>/<optimizer>.yaml`` (also validate/test/predict,
``--print_config``, ``--help``). The package's optimizers, callbacks and tasks are imported here so that
short ``class_path`` names (``SQPAdam``, ``Spring``) resolve.
"""

from __future__ import annotations

import sys

import lightning.pytorch as pl
from lightning.pytorch.cli import LightningCLI

import lit_constrained.callbacks  # noqa: F401  (registers short class paths)
import lit_constrained.optim  # noqa: F401
import lit_constrained.tasks  # noqa: F401
from lit_constrained.module import ConstrainedModule


class ConstrainedCLI(LightningCLI):
    """LightningCLI with the package's defaults (TensorBoard under lightning_logs/)."""


def main(args: list[str] | None = None) -> None:
    argv = sys.argv[1:] if args is None else args
    if argv and argv[0] == "compare":
        from lit_constrained.compare import main as compare_main

        sys.exit(compare_main(argv[1:]))
    ConstrainedCLI(
        ConstrainedModule,
        pl.LightningDataModule,
        subclass_mode_model=True,
        subclass_mode_data=True,
        auto_configure_optimizers=False,
        save_config_kwargs={"overwrite": True},
        args=args,  # None: LightningCLI reads sys.argv itself (no mixed-arguments warning)
    )


if __name__ == "__main__":
    main()

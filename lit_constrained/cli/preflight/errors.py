"""The early checks' error, and the mark of an option given without a value."""


class PreflightError(ValueError):
    """A command-line or config error found before Lightning is imported (its message is one line)."""


#: the value of an option given without one (``--model.init_args.x`` at the end of the command line)
UNSET = object()

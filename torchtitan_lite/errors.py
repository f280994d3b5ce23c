"""The errors a user fixes, printed as their one-line message without a traceback: every
:class:`UserError`.

Subclasses: ``ConfigError`` (``config/cli.py``), :class:`LaunchError`, :class:`InputError`,
``CheckpointError`` (``components/checkpoint/storage.py``), ``HFError``
(``components/hf/folder.py``), ``NonFiniteError`` (``lifecycle/faults.py``), ``InitCheckError``
(``init/step1.py``), ``TrainingError`` (``distributed/checks.py``); each also derives from the
builtin it replaces (``ValueError`` or ``RuntimeError``). ``train.main`` prints one raised while
building the run as ``input error: ...`` (exit 2), while training as ``error: ...`` (exit 1); any
other exception is a bug and propagates with its traceback (exit 1).
"""


class UserError(Exception):
    """Base of the errors whose message tells the user what to change; ``str(err)`` is one line."""


class LaunchError(UserError, RuntimeError):
    """The processes started do not fit the config or the machine (world size, degrees, devices)."""


class InputError(UserError, ValueError):
    """Training data or a tokenizer that cannot be used; the message names the file or setting."""

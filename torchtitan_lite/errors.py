"""The errors a user fixes: each is printed as its one-line message, without a traceback.

Every error the user can act on (a setting, a file, the launch, the data) is a :class:`UserError`:

  * ``ConfigError`` (:mod:`torchtitan_lite.config.cli`): a bad key, value or path, found before torchrun;
  * :class:`LaunchError`: the launch does not fit the config or the machine (world size, devices);
  * :class:`InputError`: data or tokenizer that cannot be used (files, columns, too little text);
  * ``CheckpointError`` (:mod:`torchtitan_lite.components.checkpoint`), ``HFError``
    (:mod:`torchtitan_lite.components.hf_io`): a checkpoint or Hugging Face folder that cannot be loaded;
  * ``NonFiniteError`` (:mod:`torchtitan_lite.components.faults`): a NaN/inf loss or gradient norm;
  * ``InitCheckError`` (:mod:`torchtitan_lite.init.step1`): the strict step-1 loss check failed;
  * ``TrainingError`` (:mod:`torchtitan_lite.train`): the trainer's own (a global batch the ranks cannot split).

``torchtitan_lite.train.main`` prints a ``UserError`` raised while building the run as ``input error: ...``
(exit 2) and one raised while training as ``error: ...`` (exit 1). Any other exception is a bug: it
propagates with its traceback (exit 1). Each subclass also derives from the builtin error it replaces
(``ValueError`` or ``RuntimeError``), so ``except ValueError`` callers keep working.
"""


class UserError(Exception):
    """Base of the errors whose message tells the user what to change; ``str(err)`` is one line."""


class LaunchError(UserError, RuntimeError):
    """The processes started do not fit the config or the machine (world size, degrees, devices)."""


class InputError(UserError, ValueError):
    """Training data or a tokenizer that cannot be used; the message names the file or setting."""

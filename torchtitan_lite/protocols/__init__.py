"""The contract between the engine and the model families, owned by the engine.

``models/`` implements it and imports it from here; the engine asks the registry
(``torchtitan_lite.models.get_model_spec``, ``torchtitan_lite.models.model_names``,
``torchtitan_lite.models.hf_family``) and imports nothing else from ``models/``
(``tests/test_import_boundary.py``).

  * :mod:`.model_spec`: :class:`~.model_spec.ModelSpec` (what a family is to the trainer), the
    contracts of its model class, ``parallelize`` and ``training_hooks``, and
    :class:`~.model_spec.TrainingHooks`.
  * :mod:`.state_dict_adapter`: :class:`~.state_dict_adapter.StateDictAdapter`, a family's names,
    layouts and ``config.json`` keys between our model and Hugging Face's, and
    :class:`~.state_dict_adapter.HFConfigError`.
  * :mod:`.hf_tensors`: how one of our tensors is made of HF checkpoint tensors (the kinds an
    adapter maps to, read by boxes).
"""

from torchtitan_lite.protocols.model_spec import (
    HookReport,
    ModelSpec,
    TrainingHooks,
    no_training_hooks,
)
from torchtitan_lite.protocols.state_dict_adapter import HFConfigError, StateDictAdapter

__all__ = [
    "HFConfigError",
    "HookReport",
    "ModelSpec",
    "StateDictAdapter",
    "TrainingHooks",
    "no_training_hooks",
]

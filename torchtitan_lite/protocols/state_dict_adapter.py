"""The contract of a family's Hugging Face state-dict adapter (``ModelSpec.state_dict_adapter``),
which the engine's HF import and export (``torchtitan_lite/components/hf``) go through.

An adapter class says which ``config.json`` names the family and maps its keys to our args; an
instance, built for our args, maps every tensor of our state to the HF tensors it is made of
(:mod:`.hf_tensors`). The families' shared implementation (the decoder's names, the common config
keys) is ``models/common/hf_adapter.py``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

from torchtitan_lite.protocols.hf_tensors import HFTensor


class HFConfigError(ValueError):
    """A ``config.json`` field the model cannot honour: one line naming the field, its value and
    what is supported."""


class StateDictAdapter(ABC):
    """Between our model of ``args`` and Hugging Face's: built as ``adapter(args, hf_config=None)``.

    Class attributes:
        model_type, architecture: the ``config.json`` values that name the family (``"qwen3"``,
            ``"Qwen3ForCausalLM"``); ``torchtitan_lite.models.hf_family`` picks the family of a
            folder by them.
        free_fields: args fields an override may set to another value than the folder's
            (``max_seq_len``: the length of the RoPE tables).

    Args:
        args: the arguments of our model (kept as ``self.args``).
        hf_config: the ``config.json`` dict of the folder to import, for a layout choice the adapter
            makes (e.g. DeepSeek's ``rope_interleave``); ``None`` when exporting (kept as
            ``self.hf_config``, ``{}`` then).

    Attributes a subclass sets in ``__init__``:
        tensors: our state name -> :data:`~torchtitan_lite.protocols.hf_tensors.HFTensor`, every
            tensor an HF file holds for this model (a tied ``output.weight`` is left out: it is the
            embedding), in model order.
        state_only: our persistent state that no HF file holds (MoE token counters), zero at import,
            not exported.
    """

    model_type: ClassVar[str]
    architecture: ClassVar[str]
    free_fields: ClassVar[tuple[str, ...]] = ("max_seq_len",)
    tensors: dict[str, HFTensor]
    state_only: tuple[str, ...]

    def __init__(self, args: Any, hf_config: dict[str, Any] | None = None):
        self.args, self.hf_config = args, hf_config or {}

    @staticmethod
    @abstractmethod
    def args_from_hf_config(config: dict[str, Any]) -> dict[str, Any]:
        """Args field -> value of a ``config.json`` dict, every key honoured or refused; a key the
        config leaves out takes transformers' default for the model type.

        Raises:
            HFConfigError: a key the model does not implement, or a value it does not support (one
                line naming the key and its value).
        """

    @abstractmethod
    def skipped(self, hf_name: str) -> str | None:
        """Why the HF tensor ``hf_name`` of a folder is not loaded (a tied ``lm_head.weight``,
        DeepSeek's multi-token-prediction layers), or ``None`` when it is no such known tensor (then
        it is unexpected)."""

    @abstractmethod
    def to_hf_config(self) -> dict[str, Any]:
        """The ``config.json`` that describes our model to transformers (without the tokenizer's
        special ids and the dtype, which the export adds)."""

"""What every family's Hugging Face state-dict adapter shares: the decoder's outer names, the common
config keys and :class:`DecoderStateDictAdapter`, the base that implements the engine's contract
(:class:`torchtitan_lite.protocols.state_dict_adapter.StateDictAdapter`) for a
:class:`torchtitan_lite.models.common.decoder.Decoder`.

Names (HF ``modeling_<family>.py``): ``model.embed_tokens`` = ``tok_embeddings``, per layer
``input_layernorm`` = ``attention_norm`` and ``post_attention_layernorm`` = ``ffn_norm``,
``model.norm`` = ``norm``, ``lm_head`` = ``output``; a SwiGLU ``mlp.gate_proj/up_proj/down_proj`` =
``w1/w3/w2`` (:data:`SWIGLU_NAMES`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torchtitan_lite.models.common.hf_config import ConfigFields
from torchtitan_lite.protocols.hf_tensors import HFTensor, Same, Stacked
from torchtitan_lite.protocols.state_dict_adapter import StateDictAdapter

SWIGLU_NAMES = {
    "w1.weight": "gate_proj.weight",
    "w3.weight": "up_proj.weight",
    "w2.weight": "down_proj.weight",
}
"""Our name -> HF name of a SwiGLU's weights (``models/common/ffn.py``), relative to the module (HF
``mlp.``)."""


def same(prefix: str, table: dict[str, str]) -> dict[str, HFTensor]:
    """``{ours: Same(prefix + hf)}`` for a table ``ours -> hf``."""
    return {ours: Same(prefix + hf) for ours, hf in table.items()}


def per_expert(prefix: str, num_experts: int) -> dict[str, HFTensor]:
    """The SwiGLU experts (:class:`torchtitan_lite.models.common.experts.GroupedSwiGLUExperts`
    ``w1``/``w3``/``w2``, our names relative to the layer) from the layout of the published
    Qwen3-MoE and DeepSeek-V3 safetensors: one tensor per expert,
    ``mlp.experts.{e}.gate_proj/up_proj/down_proj.weight`` (transformers 5 fuses them on load, with
    ``conversion_mapping.py``'s ``qwen2_moe`` rules, and splits them again on save)."""
    table = {"w1": "gate_proj.weight", "w3": "up_proj.weight", "w2": "down_proj.weight"}
    return {
        f"moe.experts.{ours}": Stacked(
            tuple(f"{prefix}mlp.experts.{e}.{hf}" for e in range(num_experts))
        )
        for ours, hf in table.items()
    }


def decoder_tensors(
    args: Any, layer: Callable[[int, str], dict[str, HFTensor]]
) -> dict[str, HFTensor]:
    """Every tensor of a decoder (:class:`torchtitan_lite.models.common.decoder.Decoder`): the outer
    ones, the two block norms, and ``layer(i, "model.layers.{i}.")``'s (our names relative to
    ``layers.{i}.``), in model order."""
    tensors: dict[str, HFTensor] = {"tok_embeddings.weight": Same("model.embed_tokens.weight")}
    for i in range(args.n_layers):
        prefix = f"model.layers.{i}."
        block = same(
            prefix,
            {
                "attention_norm.weight": "input_layernorm.weight",
                "ffn_norm.weight": "post_attention_layernorm.weight",
            },
        )
        block.update(layer(i, prefix))
        tensors.update({f"layers.{i}.{name}": t for name, t in block.items()})
    tensors["norm.weight"] = Same("model.norm.weight")
    if not args.tie_embeddings:
        tensors["output.weight"] = Same("lm_head.weight")
    return tensors


def tied_head(args: Any, hf_name: str) -> str | None:
    """Why ``lm_head.weight`` is not loaded into a tied model (some tied checkpoints store the
    copy), else ``None``."""
    if args.tie_embeddings and hf_name == "lm_head.weight":
        return "tie_word_embeddings: the output projection is the embedding"
    return None


def decoder_config(args: Any) -> dict[str, Any]:
    """The ``config.json`` keys every family writes from the shared decoder fields."""
    return {
        "hidden_size": args.dim,
        "num_hidden_layers": args.n_layers,
        "vocab_size": args.vocab_size,
        "rms_norm_eps": args.norm_eps,
        "max_position_embeddings": args.max_seq_len,
        "tie_word_embeddings": args.tie_embeddings,
        "initializer_range": args.init_std,
    }


class DecoderStateDictAdapter(StateDictAdapter):
    """The base of the families' adapters (the contract:
    :class:`~torchtitan_lite.protocols.StateDictAdapter`): a subclass sets ``model_type``,
    ``architecture``, ``args_from_hf_config`` (and ``free_fields`` when not ``max_seq_len``) and
    implements :meth:`layer_tensors` and :meth:`family_config`; the DeepSeek-V3 one also reads
    ``hf_config`` and skips its MTP layers.

    Args:
        args: the arguments of our model.
        hf_config: the ``config.json`` of the folder to import, or ``None`` when exporting.
    """

    def __init__(self, args: Any, hf_config: dict[str, Any] | None = None):
        super().__init__(args, hf_config)
        self.tensors = decoder_tensors(args, self.layer_tensors)
        self.state_only = self.state_tensors()

    def layer_tensors(self, i: int, prefix: str) -> dict[str, HFTensor]:
        """Block ``i``'s tensors besides its two norms: our name relative to ``layers.{i}.`` ->
        kind, the HF names starting with ``prefix`` (``model.layers.{i}.``)."""
        raise NotImplementedError

    def state_tensors(self) -> tuple[str, ...]:
        """Our persistent state no HF file holds (``state_only``); none by default."""
        return ()

    def skipped(self, hf_name: str) -> str | None:
        """Why the HF tensor ``hf_name`` is not loaded (a tied model's ``lm_head.weight``), or
        ``None``."""
        return tied_head(self.args, hf_name)

    def family_config(self) -> dict[str, Any]:
        """The family's own ``config.json`` keys (besides :func:`decoder_config`'s)."""
        raise NotImplementedError

    def to_hf_config(self) -> dict[str, Any]:
        """The ``config.json`` that describes our model to transformers."""
        return {
            "architectures": [self.architecture],
            "model_type": self.model_type,
            **decoder_config(self.args),
            **self.family_config(),
        }


def moe_counters(
    args: Any, first_moe_layer: int = 0, names: tuple[str, ...] = ("tokens_per_expert",)
) -> tuple[str, ...]:
    """``layers.{i}.moe.<name>`` for the MoE layers from ``first_moe_layer`` on: state no HF file
    holds."""
    return tuple(
        f"layers.{i}.moe.{name}" for i in range(first_moe_layer, args.n_layers) for name in names
    )


DECODER_KEYS = {
    "hidden_size": "dim",
    "num_hidden_layers": "n_layers",
    "vocab_size": "vocab_size",
    "rms_norm_eps": "norm_eps",
    "max_position_embeddings": "max_seq_len",
    "tie_word_embeddings": "tie_embeddings",
    "initializer_range": "init_std",
}
"""The ``config.json`` key of each shared decoder field (:func:`decoder_config` writes them)."""


def read_decoder(fields: ConfigFields) -> dict[str, Any]:
    """The shared decoder keys (:data:`DECODER_KEYS`) as args fields."""
    values = {ours: fields.get(hf) for hf, ours in DECODER_KEYS.items()}
    values["norm_eps"], values["init_std"] = float(values["norm_eps"]), float(values["init_std"])
    return values

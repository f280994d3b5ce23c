"""Reading a Hugging Face ``config.json`` into model args so that every field is honoured or
refused.

A family's ``args_from_hf_config`` reads the config through :class:`ConfigFields`: each key is
either mapped to an args field (:meth:`ConfigFields.get`), accepted only at values that change
nothing for our model (:meth:`ConfigFields.expect`), or listed as changing nothing at all
(:meth:`ConfigFields.ignore`). :meth:`ConfigFields.finish` refuses every key left over, so a field
the model does not implement is an error naming it, never silently dropped. A key the config leaves
out takes transformers' default for that model type (the ``defaults`` table each family copies from
its transformers config class; ``tests/test_hf_config.py`` compares the tables with the classes).

RoPE parameters appear in three shapes (:func:`rope_parameters`): published checkpoints write
``rope_theta`` at the top level and ``rope_scaling`` as ``null`` or a dict with ``type`` or
``rope_type``; transformers 5 writes ``rope_parameters`` (``rope_type``, ``rope_theta`` and the
scaling keys in one dict).
"""

from __future__ import annotations

from typing import Any

from torchtitan_lite.protocols.state_dict_adapter import HFConfigError

_MISSING = object()


class ConfigFields:
    """One ``config.json`` dict (or a nested dict such as ``rope_scaling``) read key by key.

    Args:
        config: the parsed JSON object.
        defaults: transformers' defaults for keys the config may leave out.
        where: prefix of the field names in messages (``""``, or ``"rope_scaling."`` for a nested
            dict).
        family: our model family, for messages.
    """

    def __init__(
        self, config: dict[str, Any], defaults: dict[str, Any], *, family: str, where: str = ""
    ):
        self.config, self.defaults, self.family, self.where = config, defaults, family, where
        self.used: set[str] = set()

    def has(self, key: str) -> bool:
        """The config holds ``key`` (a default does not count)."""
        return key in self.config

    def get(self, key: str, default: Any = _MISSING) -> Any:
        """The value of ``key``: the config's, else ``default``, else transformers' default.

        Raises:
            HFConfigError: the config lacks ``key`` and there is no default.
        """
        self.used.add(key)
        if key in self.config:
            return self.config[key]
        if default is not _MISSING:
            return default
        if key in self.defaults:
            return self.defaults[key]
        raise HFConfigError(
            f"config.json has no {self.where}{key} and transformers has no default for it; add it"
        )

    def expect(self, key: str, *allowed: Any) -> Any:
        """The value of ``key`` (see :meth:`get`), which must be one of ``allowed``.

        Raises:
            HFConfigError: another value, named with the supported ones.
        """
        value = self.get(key)
        if value not in allowed:
            shown = " or ".join(repr(a) for a in allowed)
            raise HFConfigError(
                f"config.json {self.where}{key} = {value!r} is not supported by the {self.family} "
                f"model (it implements {shown})"
            )
        return value

    def ignore(self, *keys: str) -> None:
        """Accept ``keys`` with any value: they change nothing in the model (file dtype, caching,
        token ids)."""
        self.used.update(keys)

    def fail(self, key: str, why: str) -> HFConfigError:
        """The error for ``key``'s value: ``config.json <key> = <value> <why>``."""
        return HFConfigError(
            f"config.json {self.where}{key} = {self.config.get(key, self.defaults.get(key))!r} "
            f"{why}"
        )

    def aliased(self, key: str, alias: str) -> Any:
        """The value of ``key``, or of ``alias`` (transformers writes one name, published files the
        other); when both are present they must agree.

        Raises:
            HFConfigError: both present with different values.
        """
        if not self.has(alias):
            self.used.add(alias)
            return self.get(key)
        value = self.get(alias)
        if self.has(key) and self.get(key) != value:
            raise self.fail(key, f"differs from {self.where}{alias} = {value!r}; keep one of them")
        self.used.add(key)
        return value

    def finish(self) -> None:
        """Every key of the config was read, checked or ignored.

        Raises:
            HFConfigError: the first key (sorted) that was not, named with its value.
        """
        left = sorted(set(self.config) - self.used)
        if left:
            key = left[0]
            more = f" (and {len(left) - 1} more: {', '.join(left[1:])})" if len(left) > 1 else ""
            raise HFConfigError(
                f"config.json {self.where}{key} = {self.config[key]!r}{more} is not implemented by "
                f"the {self.family} model and is not known to change nothing; use a checkpoint "
                "without it, or add it to the family's state_dict_adapter.py"
            )


YARN_DEFAULTS = {"beta_fast": 32.0, "beta_slow": 1.0, "truncate": True}
"""transformers' YaRN defaults (``_compute_yarn_parameters`` in ``modeling_rope_utils.py``)."""


def rope_parameters(
    fields: ConfigFields, default_theta: float, default_rope: dict[str, Any] | None = None
) -> ConfigFields:
    """The RoPE parameters of a config as one nested :class:`ConfigFields` (``where`` names the key
    they came from), with ``rope_type`` set (``"default"`` = no scaling) and ``rope_theta`` filled
    from the top level or ``default_theta``; ``default_rope`` is transformers' default when the
    config has neither key (GPT-OSS: YaRN).

    Raises:
        HFConfigError: both ``rope_scaling`` and ``rope_parameters`` are set and differ, or ``type``
            and ``rope_type`` disagree.
    """
    scaling, params = fields.get("rope_scaling", None), fields.get("rope_parameters", None)
    top_theta = fields.get("rope_theta", None)
    if scaling and params and {k: v for k, v in params.items() if k != "rope_theta"} != scaling:
        raise fields.fail(
            "rope_scaling", f"differs from rope_parameters = {params!r}; keep one of them"
        )
    where, rope = (
        ("rope_scaling.", dict(scaling)) if scaling else ("rope_parameters.", dict(params or {}))
    )
    if not scaling and not params and default_rope is not None:
        where, rope = "rope_parameters (transformers' default).", dict(default_rope)
    if "type" in rope and rope.setdefault("rope_type", rope["type"]) != rope["type"]:
        raise HFConfigError(
            f"config.json {where}type = {rope['type']!r} but rope_type = {rope['rope_type']!r}"
        )
    rope.setdefault("rope_type", "default")
    if top_theta is not None and rope.setdefault("rope_theta", top_theta) != top_theta:
        raise HFConfigError(
            f"config.json rope_theta = {top_theta!r} but {where}rope_theta = {rope['rope_theta']!r}"
        )
    rope.setdefault("rope_theta", default_theta)
    nested = ConfigFields(rope, YARN_DEFAULTS, family=fields.family, where=where)
    nested.ignore("type")
    return nested


FILE_FIELDS = (
    "architectures",
    "model_type",
    "torch_dtype",
    "dtype",
    "transformers_version",
    "_name_or_path",
    "auto_map",
    "use_cache",
    "bos_token_id",
    "eos_token_id",
    "pad_token_id",
    "output_attentions",
    "output_hidden_states",
    "return_dict",
    "output_router_logits",
    "quantization_config",
)
"""Keys that describe the file or the forward's outputs, not the architecture: which class and code
loads it (``architectures``, ``model_type``, ``auto_map``: checked when the family is picked), the
stored dtype, the version that wrote it, the KV cache, the tokenizer's special ids (exported from
the tokenizer), what the forward returns besides logits; ``quantization_config`` is honoured by the
loader (``torchtitan_lite/components/hf``), which dequantizes or refuses it."""


def float_or_none(value: Any) -> float | None:
    """A JSON number as a float (``rope_theta`` may be written as an integer); ``None`` stays."""
    return None if value is None else float(value)

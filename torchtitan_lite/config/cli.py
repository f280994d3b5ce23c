"""Typed values from TOML and the command line, for any sectioned dataclass schema
(``config/schema.py``): field docs read from the string under each field (as torchtitan's
``JobConfig``), coercion to the annotation, declared bounds, ``--help`` and the resolved TOML. Field
types: ``int``, ``float``, ``str``, ``bool``, ``X | None``, ``list[X]``, ``Literal[...]`` and
``dict[str, Any]`` (a sub-table the caller validates).
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import inspect
import json
import math
import re
import textwrap
import types
import typing
from typing import Any, Literal, Union

from torchtitan_lite.errors import UserError

COMMAND_LINE = "command line"
"""The location recorded for a value given as ``--section.key``."""

_NONE_WORDS = ("none", "null")
_BOUNDS = {"ge": ">=", "gt": ">", "le": "<=", "lt": "<"}


class ConfigError(UserError, ValueError):
    """A bad configuration; ``str(err)`` is one line naming the key, where it was set, and the
    fix."""


class BadValue(ValueError):
    """A value that does not fit its type or range; the caller adds key and location."""


def bounded(
    default: Any,
    *,
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
    lt: float | None = None,
) -> Any:
    """A dataclass field with ``default`` whose value must satisfy the given bounds.

    Example: ``steps: int = bounded(200, ge=1)``. ``None`` values (of ``X | None`` fields) are not
    range-checked.
    """
    limits = {
        name: value
        for name, value in (("ge", ge), ("gt", gt), ("le", le), ("lt", lt))
        if value is not None
    }
    return dataclasses.field(default=default, metadata=limits)


def field_docs(cls: type) -> dict[str, str]:
    """Map each field of dataclass ``cls`` to the string literal right under its annotation ("" if
    none).

    Raises:
        OSError: the source of ``cls`` is unavailable (e.g. a frozen executable).
    """
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body
    docs: dict[str, str] = {}
    for stmt, nxt in zip(body, body[1:] + [None], strict=True):
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            value = nxt.value if isinstance(nxt, ast.Expr) else None
            is_doc = isinstance(value, ast.Constant) and isinstance(value.value, str)
            docs[stmt.target.id] = inspect.cleandoc(value.value) if is_doc else ""
    return docs


def is_bool(tp: Any) -> bool:
    """Whether annotation ``tp`` is ``bool`` or ``bool | None`` (a field that a bare ``--flag``
    sets)."""
    if typing.get_origin(tp) in (Union, types.UnionType):
        return bool in typing.get_args(tp)
    return tp is bool


def field_type(root: type, key: str) -> Any:
    """The annotation of ``section.field`` in the sectioned dataclass ``root``, or ``None`` if
    unknown."""
    section_name, _, field_name = key.partition(".")
    section = typing.get_type_hints(root).get(section_name)
    if section is None or not dataclasses.is_dataclass(section):
        return None
    return typing.get_type_hints(section).get(field_name)


def type_name(tp: Any) -> str:
    """Readable name of a supported annotation, e.g. ``int``, ``str | None``,
    ``"none" | "full"``."""
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        return " | ".join(type_name(arg) for arg in typing.get_args(tp))
    if origin is Literal:
        return " | ".join(json.dumps(choice) for choice in typing.get_args(tp))
    if origin is list:
        return f"list[{type_name(typing.get_args(tp)[0])}]"
    if origin is dict:
        return "table"
    if tp is type(None):
        return "None"
    return tp.__name__


def coerce(value: Any, tp: Any, *, from_cli: bool) -> Any:
    """``value`` (a TOML value, or with ``from_cli`` a command-line string or ``True`` for a bare
    flag) converted to annotation ``tp``. Command-line strings: numbers, ``true``/``false``,
    ``none``/``null`` for ``X | None``, comma-separated items (optionally in brackets) for
    ``list[X]``.

    Raises:
        BadValue: the value does not fit ``tp`` (message says what was expected and what came).
    """
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        members = [arg for arg in typing.get_args(tp) if arg is not type(None)]
        if from_cli and isinstance(value, str) and value.lower() in _NONE_WORDS:
            return None
        (inner,) = members
        return coerce(value, inner, from_cli=from_cli)
    if origin is Literal:
        choices = typing.get_args(tp)
        matches = [
            c
            for c in choices
            if c == value or (from_cli and isinstance(value, str) and str(c) == value)
        ]
        if not matches:
            raise BadValue(
                f"must be one of {', '.join(json.dumps(c) for c in choices)}; got {value!r}"
            )
        return matches[0]
    if origin is list:
        (item_tp,) = typing.get_args(tp)
        if from_cli and isinstance(value, str):
            inner = value.strip().removeprefix("[").removesuffix("]").strip()
            value = [item.strip() for item in inner.split(",")] if inner else []
        if not isinstance(value, list):
            raise BadValue(f"expected {type_name(tp)}, got {value!r}")
        return [coerce(item, item_tp, from_cli=from_cli) for item in value]
    if origin is dict:
        if not isinstance(value, dict):
            raise BadValue(f"expected a table of key = value, got {value!r}")
        return dict(value)
    if from_cli and isinstance(value, str):
        return _finite(_parse_cli_scalar(value, tp))
    if tp is bool and isinstance(value, bool):
        return value
    if tp is int and isinstance(value, int) and not isinstance(value, bool):
        return value
    if tp is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        return _finite(float(value))
    if tp is str and isinstance(value, str):
        return value
    raise BadValue(f"expected {type_name(tp)}, got {value!r} ({type(value).__name__})")


def _finite(value: Any) -> Any:
    """``value``, unless it is a float that is infinite or NaN (no setting takes one)."""
    if isinstance(value, float) and not math.isfinite(value):
        raise BadValue(f"must be a finite number, got {value!r}")
    return value


def _parse_cli_scalar(text: str, tp: Any) -> Any:
    """A command-line string parsed as ``int``, ``float``, ``bool`` or ``str``."""
    if tp is str:
        return text
    if tp is bool:
        if text.lower() in ("true", "false"):
            return text.lower() == "true"
        raise BadValue(f"expected bool (true or false), got {text!r}")
    try:
        return tp(text)
    except ValueError:
        raise BadValue(f"expected {tp.__name__}, got {text!r}") from None


def check_bounds(value: Any, metadata: typing.Mapping[str, Any]) -> None:
    """Raise :class:`BadValue` if ``value`` violates the bounds declared by :func:`bounded`."""
    if value is None:
        return
    for name, symbol in _BOUNDS.items():
        if name not in metadata:
            continue
        limit = metadata[name]
        ok = {"ge": value >= limit, "gt": value > limit, "le": value <= limit, "lt": value < limit}[
            name
        ]
        if not ok:
            raise BadValue(f"must be {symbol} {limit}, got {value!r}")


def bounds_text(metadata: typing.Mapping[str, Any]) -> str:
    """The declared bounds as text, e.g. ``>= 1, <= 1``; "" if none."""
    return ", ".join(f"{_BOUNDS[name]} {metadata[name]}" for name in _BOUNDS if name in metadata)


def split_cli(argv: list[str], is_flag: typing.Callable[[str], bool]) -> list[tuple[str, Any]]:
    """Command-line tokens as ``(dotted_key, value)`` pairs, in order.

    Forms: ``--a.b=value``, ``--a.b value``, and a bare ``--a.b`` (value ``True``) when the next
    token starts with ``--`` or there is none. A key for which ``is_flag`` is true takes the next
    token only if it reads ``true`` or ``false``.

    Raises:
        ConfigError: a token that is not ``--section.key`` (e.g. a stray positional argument).
    """
    pairs: list[tuple[str, Any]] = []
    i = 0
    while i < len(argv):
        token = argv[i]
        if not token.startswith("--") or len(token) == 2:
            raise ConfigError(
                f"unexpected argument {token!r}: options look like --section.key=value (see --help)"
            )
        key, eq, value = token[2:].partition("=")
        if not eq:
            nxt = argv[i + 1] if i + 1 < len(argv) else None
            takes_next = nxt is not None and not nxt.startswith("--")
            if takes_next and is_flag(key):
                takes_next = nxt.lower() in ("true", "false")
            value = nxt if takes_next else True
            i += 1 if takes_next else 0
        if "." not in key:
            raise ConfigError(
                f"--{key} ({COMMAND_LINE}): options are --section.key, e.g. --training.steps=10 "
                "(see --help)"
            )
        pairs.append((key, value))
        i += 1
    return pairs


def flatten_toml(data: dict[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    """Nested TOML tables as ``(dotted_key, value)`` pairs, in file order (``{"a": {"b": 1}}`` ->
    ``a.b``)."""
    pairs: list[tuple[str, Any]] = []
    for key, value in data.items():
        dotted = f"{prefix}{key}"
        pairs.extend(
            flatten_toml(value, f"{dotted}.") if isinstance(value, dict) else [(dotted, value)]
        )
    return pairs


MOVED_KEYS = {
    "parallelism.activation_checkpoint": "activation_checkpoint.mode",
    "parallelism.compile": "compile.enable",
}
"""Keys that moved to another section: named in the error instead of a "did you mean" guess."""


def set_value(config: Any, key: str, value: Any, where: str) -> None:
    """Set ``key`` (``section.field``, or ``section.field.name`` for a table field) on the sectioned
    ``config``; ``where`` (:data:`COMMAND_LINE` or ``"file.toml line 3"``) goes into messages and
    decides the parsing.

    Raises:
        ConfigError: unknown section or key, a value of the wrong type, or one out of its bounds.
    """
    parts = key.split(".")
    sections = {f.name: f for f in dataclasses.fields(config)}
    if len(parts) == 1:
        raise ConfigError(
            f"{key} ({where}): every key belongs in a section such as [training] (see --help)"
        )
    if parts[0] not in sections:
        raise ConfigError(
            f"{key} ({where}): unknown section [{parts[0]}]{suggestion(parts[0], sections)}; "
            f"sections: {', '.join(sections)}"
        )
    section = getattr(config, parts[0])
    fields = {f.name: f for f in dataclasses.fields(section)}
    known = [f"{parts[0]}.{name}" for name in fields]
    if parts[1] not in fields:
        moved = MOVED_KEYS.get(".".join(parts[:2]))
        hint = f" (moved: use {moved})" if moved else suggestion(".".join(parts[:2]), known)
        raise ConfigError(
            f"{key} ({where}): unknown key{hint}; keys of [{parts[0]}]: {', '.join(fields)}"
        )
    f = fields[parts[1]]
    tp = typing.get_type_hints(type(section))[f.name]
    if where == COMMAND_LINE and value is True and not is_bool(tp):
        raise ConfigError(f"{key} ({where}): needs a value, e.g. --{key}=VALUE")
    is_table = typing.get_origin(tp) is dict
    if is_table and len(parts) == 3:
        getattr(section, f.name)[parts[2]] = value
        return
    if len(parts) != 2:
        form = f"{parts[0]}.{parts[1]}" + (".<name>" if is_table else "")
        raise ConfigError(f"{key} ({where}): unknown key; the form is {form}")
    try:
        coerced = coerce(value, tp, from_cli=where == COMMAND_LINE)
        check_bounds(coerced, f.metadata)
    except BadValue as err:
        raise ConfigError(f"{key} ({where}): {err}") from None
    setattr(section, f.name, coerced)


def toml_line(text: str, dotted_key: str) -> int | None:
    """1-based line of ``dotted_key`` (``section.key`` or ``section.sub.key``) in TOML ``text``.

    Understands ``[table]`` headers and ``key = value`` lines (dotted and quoted keys); returns the
    line of the header for a whole-table key, or ``None`` if not found.
    """
    table = ""
    for number, line in enumerate(text.splitlines(), start=1):
        header = re.match(r"^\s*\[([^\[\]]+)\]\s*(#.*)?$", line)
        if header:
            table = _normalize_key(header.group(1))
            if table == dotted_key:
                return number
            continue
        assignment = re.match(r"^\s*([A-Za-z0-9_\-.\"' ]+?)\s*=", line)
        if assignment:
            key = _normalize_key(assignment.group(1))
            if (f"{table}.{key}" if table else key) == dotted_key:
                return number
    return None


def _normalize_key(key: str) -> str:
    """``a . "b"`` -> ``a.b``."""
    return ".".join(part.strip().strip("\"'") for part in key.split("."))


def suggestion(name: str, candidates: typing.Iterable[str]) -> str:
    """`` (did you mean X?)`` for a close match of ``name`` among ``candidates``, else ""."""
    close = difflib.get_close_matches(name, list(candidates), n=1)
    return f" (did you mean {close[0]}?)" if close else ""


def format_help(root: type, title: str, set_by: typing.Mapping[str, tuple[Any, str]] = {}) -> str:
    """Every key of the sectioned dataclass ``root``: ``--section.key  type = default  (bounds)``
    and its doc; ``set_by`` maps keys (``section.key``, or ``section.table.name`` for a table's
    item) to ``(value, where)``, shown under the key as ``this run: value (where)``."""
    lines = [title, ""]
    section_docs = field_docs(root)
    for section in dataclasses.fields(root):
        cls = typing.get_type_hints(root)[section.name]
        lines.append(f"[{section.name}]  {section_docs[section.name]}")
        hints, docs, defaults = typing.get_type_hints(cls), field_docs(cls), cls()
        for f in dataclasses.fields(cls):
            key = f"{section.name}.{f.name}"
            default = getattr(defaults, f.name)
            shown = "{}" if isinstance(default, dict) else _toml_value(default)
            limits = bounds_text(f.metadata)
            lines.append(
                f"  --{key}  {type_name(hints[f.name])} = {shown}"
                + (f"  ({limits})" if limits else "")
            )
            for given, (value, where) in set_by.items():
                if given == key or given.startswith(key + "."):
                    item = given.removeprefix(key).removeprefix(".")
                    lines.append(
                        f"      this run: {f'{item} = ' if item else ''}{_toml_value(value)} "
                        f"({where})"
                    )
            lines.extend(f"      {doc_line}" for doc_line in docs[f.name].splitlines())
        lines.append("")
    return "\n".join(lines)


NOT_SAVED = ("job.config_file", "job.print_config")
"""Keys a saved config leaves out: the file to load (command line only) and ``print_config`` (a file
holding it would only print)."""


def config_dict(config: Any) -> dict[str, dict[str, Any]]:
    """The sectioned dataclass instance ``config`` as ``{section: {key: value}}`` (tables as dicts),
    without
    :data:`NOT_SAVED`: what :func:`format_toml` writes."""
    return {
        section.name: {
            f.name: getattr(getattr(config, section.name), f.name)
            for f in dataclasses.fields(getattr(config, section.name))
            if f"{section.name}.{f.name}" not in NOT_SAVED
        }
        for section in dataclasses.fields(config)
    }


def format_toml(config: Any) -> str:
    """The sectioned dataclass instance ``config`` as TOML text that loads back as the same config
    (:func:`config_dict`); ``None`` values appear as comments."""
    lines: list[str] = []
    for section, values in config_dict(config).items():
        lines.append(f"[{section}]")
        tables = []
        for name, item in values.items():
            if isinstance(item, dict):
                tables.append((name, item))
            elif item is None:
                lines.append(f"# {name} is unset")
            else:
                lines.append(f"{name} = {_toml_value(item)}")
        for name, table in tables:
            lines.append(f"\n[{section}.{name}]")
            lines.extend(f"{key} = {_toml_value(item)}" for key, item in table.items())
        lines.append("")
    return "\n".join(lines)


def _toml_value(value: Any) -> str:
    """One value as a TOML literal (``None`` shown as ``none``, for help text)."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(item) for item in value) + "]"
    return repr(value)

"""The engine knows the models only through the registry: nothing under torchtitan_lite/ imports a module of
models/ (``models.<family>`` or ``models.common``), nor names from ``models`` beyond the registry's ``__all__``;
and every family's ModelSpec is complete."""

from __future__ import annotations

import ast
from pathlib import Path

import models
from models import ModelSpec, get_model_spec, hf_family, model_names

ENGINE = Path(__file__).resolve().parents[1] / "torchtitan_lite"


def model_imports(source: str) -> list[str]:
    """Every import of ``models`` or ``models.*`` in ``source``, as ``module`` or ``module:name``, including
    ``importlib.import_module("models...")`` calls with a constant or f-string argument."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names if alias.name.split(".")[0] == "models"]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module.split(".")[0] == "models":
            found += [f"{node.module}:{alias.name}" for alias in node.names]
        elif (isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None)) == "import_module"
              and node.args and isinstance(node.args[0], (ast.Constant, ast.JoinedStr))):
            text = ast.unparse(node.args[0]).strip("'\"f")
            if text.split(".")[0] == "models":
                found.append(text)
    return found


def forbidden(imports: list[str]) -> list[str]:
    """The imports that bypass the registry: anything but ``from models import <name in models.__all__>``."""
    return [i for i in imports if not (i.startswith("models:") and i.split(":")[1] in models.__all__)]


def test_the_scan_sees_every_kind_of_import():
    source = ("import models.qwen3\nfrom models.common.moe import MoE\nfrom models import get_model_spec, MoE\n"
              "import importlib\nimportlib.import_module(f'models.{name}.state_dict_adapter')\n")
    assert forbidden(model_imports(source)) == ["models.qwen3", "models.common.moe:MoE", "models:MoE",
                                                "models.{name}.state_dict_adapter"]


def test_the_engine_imports_models_only_through_the_registry():
    offenders = {}
    for path in sorted(ENGINE.rglob("*.py")):
        bad = forbidden(model_imports(path.read_text(encoding="utf-8")))
        if bad:
            offenders[str(path.relative_to(ENGINE.parent))] = bad
    assert offenders == {}
    uses = [i for p in ENGINE.rglob("*.py") for i in model_imports(p.read_text(encoding="utf-8"))]
    assert "models:get_model_spec" in uses  # the scan reads the files that do use the registry


def test_every_family_has_a_complete_spec():
    for name in model_names():
        spec = get_model_spec(name)
        assert isinstance(spec, ModelSpec) and spec.name == name
        assert all(callable(f) for f in (spec.model_cls, spec.init_plan, spec.num_flops_per_token, spec.parallelize,
                                         spec.training_hooks)), name
        assert spec.flavors and "debug" in spec.flavors, name
        adapter = spec.state_dict_adapter  # every family imports and exports HF (issue 15)
        assert adapter is not None and callable(adapter.args_from_hf_config), name
        assert hf_family(adapter.model_type, None) == hf_family(None, [adapter.architecture]) == name

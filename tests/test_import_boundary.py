"""The engine owns the contract and knows the models only through the registry: nothing under
torchtitan_lite/ imports a module of models/ (imported as ``torchtitan_lite.models``: ``.<family>``
or ``.common``), nor a name from it but the registry lookup (the contract's types come from
``torchtitan_lite.protocols``); a family imports the engine, ``.common`` and itself, never another
family, and ``.common`` imports no family; every family's ModelSpec is complete (its init plan
covers its debug model exactly). The engine's floors: ``config`` (schema, cli, load, paths,
reference) is the ground floor; ``preflight`` is imported only by the entry points; every package
imports only from the floors below it (``import_graph.FLOORS``), and no cycle exists."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import import_graph
import torch
from model_helpers import assert_plan_covers_exactly

import torchtitan_lite.models as models
from torchtitan_lite import protocols
from torchtitan_lite.models import get_model_spec, hf_family, model_names
from torchtitan_lite.protocols import ModelSpec, StateDictAdapter

ENGINE = Path(__file__).resolve().parents[1] / "torchtitan_lite"
MODELS = Path(__file__).resolve().parents[1] / "models"
REGISTRY = ("get_model_spec", "hf_family", "model_names")
"""All the engine may import from ``models``."""


PACKAGE = "torchtitan_lite.models"
"""The name models/ is imported under (``torchtitan_lite/models``, a symlink to it)."""


def short(module: str) -> str | None:
    """``models[.rest]`` for ``torchtitan_lite.models[.rest]``; ``None`` for any other module (a
    bare ``models`` is a user's package, never ours)."""
    if module == PACKAGE or module.startswith(PACKAGE + "."):
        return module[len("torchtitan_lite.") :]
    return None


def model_imports(source: str) -> list[str]:
    """Every import of ``torchtitan_lite.models[.*]`` in ``source``, as ``models[.rest]`` or
    ``models[.rest]:name``, including ``importlib.import_module("torchtitan_lite.models...")`` calls
    with a constant or f-string argument."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [short(alias.name) for alias in node.names if short(alias.name)]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and short(node.module):
            found += [f"{short(node.module)}:{alias.name}" for alias in node.names]
        elif (
            isinstance(node, ast.Call)
            and getattr(node.func, "attr", getattr(node.func, "id", None)) == "import_module"
            and node.args
            and isinstance(node.args[0], (ast.Constant, ast.JoinedStr))
        ):
            text = short(ast.unparse(node.args[0]).strip("'\"f"))
            if text:
                found.append(text)
    return found


def forbidden(imports: list[str]) -> list[str]:
    """The imports that bypass the registry: anything but
    ``from torchtitan_lite.models import <registry lookup>``."""
    return [i for i in imports if not (i.startswith("models:") and i.split(":")[1] in REGISTRY)]


def foreign(imports: list[str], family: str) -> list[str]:
    """The imports of a file of ``models/<family>/`` (``family`` = ``"common"`` for
    ``models/common/``) that reach beyond itself and ``torchtitan_lite.models.common``: another
    family, or the registry package ``models`` itself."""
    return [i for i in imports if i.split(":")[0].split(".")[1:2] not in ([family], ["common"])]


def test_the_scan_sees_every_kind_of_import():
    source = (
        "import torchtitan_lite.models.qwen3\nfrom torchtitan_lite.models.common.moe import MoE\n"
        "from torchtitan_lite.models import get_model_spec, MoE\nimport models.qwen3\n"
        "import importlib\n"
        "importlib.import_module(f'torchtitan_lite.models.{name}.state_dict_adapter')\n"
    )
    assert forbidden(model_imports(source)) == [
        "models.qwen3",
        "models.common.moe:MoE",
        "models:MoE",
        "models.{name}.state_dict_adapter",
    ]
    family = (
        "from torchtitan_lite.models.qwen3.model import Attention\n"
        "from torchtitan_lite.models.common.ffn import FeedForward\n"
        "from torchtitan_lite.models import ModelSpec\nfrom torchtitan_lite.models.gpt_oss.args "
        "import A\n"
    )
    assert foreign(model_imports(family), "gpt_oss") == [
        "models.qwen3.model:Attention",
        "models:ModelSpec",
    ]


def test_models_exports_only_the_registry_lookup_and_the_contract_is_the_engines():
    assert sorted(models.__all__) == sorted(REGISTRY)
    for name in protocols.__all__:  # ModelSpec, TrainingHooks, StateDictAdapter, ...
        assert getattr(protocols, name).__module__.startswith("torchtitan_lite.protocols."), name
    for name in model_names():
        adapter = get_model_spec(name).state_dict_adapter
        assert isinstance(get_model_spec(name), ModelSpec) and issubclass(
            adapter, StateDictAdapter
        ), name


def test_the_engine_imports_models_only_through_the_registry():
    offenders = {}
    for path in sorted(ENGINE.rglob("*.py")):
        bad = forbidden(model_imports(path.read_text(encoding="utf-8")))
        if bad:
            offenders[str(path.relative_to(ENGINE.parent))] = bad
    assert offenders == {}
    uses = [i for p in ENGINE.rglob("*.py") for i in model_imports(p.read_text(encoding="utf-8"))]
    assert "models:get_model_spec" in uses  # the scan reads the files that do use the registry


def test_a_family_imports_the_engine_common_and_itself_never_another_family():
    folders = [p for p in sorted(MODELS.iterdir()) if p.is_dir() and (p / "__init__.py").exists()]
    assert {p.name for p in folders} == {*model_names(), "common"}
    offenders, seen = {}, 0
    for folder in folders:
        for path in sorted(folder.rglob("*.py")):
            imports = model_imports(path.read_text(encoding="utf-8"))
            seen += len(imports)
            if bad := foreign(imports, folder.name):
                offenders[str(path.relative_to(MODELS.parent))] = bad
    assert offenders == {}
    assert seen > 50  # the scan reads the families' own imports


def test_every_family_has_a_complete_spec():
    for name in model_names():
        spec = get_model_spec(name)
        assert isinstance(spec, ModelSpec) and spec.name == name
        assert all(
            callable(f)
            for f in (
                spec.model_cls,
                spec.init_plan,
                spec.num_flops_per_token,
                spec.parallelize,
                spec.training_hooks,
            )
        ), name
        assert spec.flavors and "debug" in spec.flavors, name
        adapter = spec.state_dict_adapter  # every family imports and exports HF (issue 15)
        assert adapter is not None and callable(adapter.args_from_hf_config), name
        assert (
            hf_family(adapter.model_type, None) == hf_family(None, [adapter.architecture]) == name
        )
        with torch.device("meta"):
            model = spec.model_cls(spec.flavors["debug"])
        plan = spec.init_plan(spec.flavors["debug"])
        assert_plan_covers_exactly(
            model, plan
        )  # every parameter and persistent buffer, every entry used
        assert plan.entries[-1][0] == "output.weight", name  # it wins for a tied pair


def engine_imports(path: Path) -> tuple[list[str], list[str]]:
    """``(module-level, function-local)`` imports of ``torchtitan_lite`` or ``models`` modules in
    ``path`` (those for type hints only left out)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    top = {id(node) for node in tree.body}
    hints = {  # under ``if TYPE_CHECKING:``: never run
        id(inner)
        for node in tree.body
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING"
        for inner in ast.walk(node)
    }
    found: tuple[list[str], list[str]] = ([], [])
    for node in ast.walk(tree):
        if id(node) in hints:
            continue
        if isinstance(node, ast.ImportFrom) and node.level == 0:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            continue
        ours = [name for name in names if name.split(".")[0] in ("torchtitan_lite", "models")]
        found[0 if id(node) in top else 1].extend(ours)
    return found


def test_the_engine_has_no_function_local_imports_and_config_loading_is_the_base_layer():
    local = {
        str(p.relative_to(ENGINE.parent)): engine_imports(p)[1]
        for p in sorted(ENGINE.rglob("*.py"))
    }
    assert {path: names for path, names in local.items() if names} == {}
    base = ("torchtitan_lite.config.schema", "torchtitan_lite.config.cli", "torchtitan_lite.errors")
    for name in ("schema", "cli", "load"):
        imported = engine_imports(ENGINE / "config" / f"{name}.py")[0]
        assert [module for module in imported if module not in base] == [], name


ENTRY_POINTS = {
    "train.py",
    "generate.py",
    "evaluate.py",
    "inference.py",
    "tools/inspect_init.py",
    "tools/simulate.py",
}
"""The modules above the preflight: they resolve a run (``generate``/``evaluate`` through
``inference``)."""


def test_config_is_the_ground_floor_and_only_the_entry_points_import_the_preflight():
    for path in sorted((ENGINE / "config").glob("*.py")):
        imported = engine_imports(path)[0]
        assert [
            m
            for m in imported
            if not m.startswith(("torchtitan_lite.config.", "torchtitan_lite.errors"))
        ] == []
    users = {
        str(path.relative_to(ENGINE))
        for path in ENGINE.rglob("*.py")
        if path.parent.name != "preflight"
        and any(m.startswith("torchtitan_lite.preflight") for m in engine_imports(path)[0])
    }
    assert (
        users
        == {
            "train.py",
            "inference.py",
            "tools/inspect_init.py",
            "tools/simulate.py",
        }
        and users <= ENTRY_POINTS
    )


def test_a_rank_and_the_preflight_start_without_the_datasets_library():
    """``datasets`` (about 2 s of a process's start-up: pandas, pyarrow, httpx) is imported where
    raw files, a hub dataset or a stream are read, not by the trainer, the preflight or evaluate:
    every rank of a run on prepared or cached data starts without it."""
    code = (
        "import sys, torchtitan_lite.train, torchtitan_lite.preflight.checks, "
        "torchtitan_lite.evaluate; "
        "print(sorted(m for m in ('datasets', 'pandas', 'pyarrow') if m in sys.modules))"
    )
    run = subprocess.run(
        [sys.executable, "-c", code], cwd=ENGINE.parent, capture_output=True, text=True, timeout=300
    )
    assert (run.returncode, run.stdout.strip()) == (0, "[]"), run.stderr


def test_the_preflight_runs_without_importing_dynamo():
    """``torch.distributed.pipelining`` imports ``torch._dynamo`` (a second of CPU); it is imported
    by pipelined runs only, so ``run_train.sh``'s config check of a run without pipeline parallelism
    never loads dynamo."""
    code = (
        "import sys; from torchtitan_lite.preflight.checks import load_run_or_exit; "
        "load_run_or_exit(['--job.config_file', 'train_configs/qwen3_debug.toml'], world_size=2); "
        "print(sorted(m for m in ('torch._dynamo', 'torch.distributed.pipelining') if m in "
        "sys.modules))"
    )
    run = subprocess.run(
        [sys.executable, "-c", code], cwd=ENGINE.parent, capture_output=True, text=True, timeout=300
    )
    assert (run.returncode, run.stdout.strip()) == (0, "[]"), run.stderr


def test_no_arrow_runs_back_up_the_floors_and_no_import_cycle():
    edges = import_graph.engine_graph()
    assert sum(map(len, edges.values())) > 500  # the scan reads the engine's imports
    assert import_graph.arrows_back_up(edges) == []
    assert import_graph.cycles(edges) == []


def test_the_floor_scan_sees_an_arrow_back_up_and_a_cycle_and_skips_type_hints():
    sources = {
        "torchtitan_lite.protocols": "",
        "torchtitan_lite.protocols.model_spec": (
            "from typing import TYPE_CHECKING\n"
            "if TYPE_CHECKING:\n    from torchtitan_lite.init.spec import InitPlan\n"
            "def f():\n    import torchtitan_lite.train\n"
            "from torchtitan_lite.distributed.parallel_dims import ParallelDims\n"
        ),
        "torchtitan_lite.distributed": "",
        "torchtitan_lite.distributed.parallel_dims": "import torchtitan_lite.protocols.model_spec",
        "torchtitan_lite.init.spec": "",
        "torchtitan_lite.train": "",
    }
    edges = import_graph.graph(sources)
    assert edges["torchtitan_lite.protocols.model_spec"] == {
        "torchtitan_lite.distributed",
        "torchtitan_lite.distributed.parallel_dims",
    }
    assert import_graph.arrows_back_up(edges) == [
        "torchtitan_lite.protocols.model_spec -> torchtitan_lite.distributed",
        "torchtitan_lite.protocols.model_spec -> torchtitan_lite.distributed.parallel_dims",
    ]
    assert import_graph.cycles(edges) == [
        ["torchtitan_lite.distributed.parallel_dims", "torchtitan_lite.protocols.model_spec"]
    ]

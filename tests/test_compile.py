"""torch.compile of the blocks and the loss, and the fallback to eager
(torchtitan_lite.distributed.compile, train).

No inductor compile here: on this 2-core CPU one inductor compile of the tiny qwen3 model took 11.7
s with a warm cache (more when cold), too slow for the default suite. ``eager``/``aot_eager`` run
the same dynamo capture and AOT autograd path; their results are asserted BITWISE equal to eager
(same aten kernels, same order).
"""

from __future__ import annotations

import pytest
import test_qwen3
import torch
from model_helpers import build_random

from torchtitan_lite.builder import build_model
from torchtitan_lite.components.loss import build_loss_fn, cross_entropy_sum
from torchtitan_lite.config.cli import ConfigError
from torchtitan_lite.distributed import compile as compile_module
from torchtitan_lite.distributed.activation_checkpoint import apply_activation_checkpointing
from torchtitan_lite.distributed.compile import apply_compile, compile_available
from torchtitan_lite.distributed.parallel_dims import ParallelDims
from torchtitan_lite.distributed.process_group import DistInfo
from torchtitan_lite.init.apply import init_weights
from torchtitan_lite.models import get_model_spec
from torchtitan_lite.preflight.checks import parse_args, parse_run

CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def _fresh():
    compile_available.cache_clear()
    yield
    compile_available.cache_clear()


def _step(backend: str | None, mode: str = "none"):
    """Loss and gradients of the tiny qwen3 (next-token loss), compiled with ``backend`` (None =
    eager)."""
    model = build_random(get_model_spec("qwen3").model_cls, test_qwen3.TINY)
    apply_activation_checkpointing(model, mode, "op", compiled=backend is not None)
    loss_fn = cross_entropy_sum
    if backend is not None:
        apply_compile(model, backend=backend)
        config = parse_args(["--compile.enable", f"--compile.backend={backend}"])
        loss_fn = build_loss_fn(config, CPU)
        assert loss_fn is not cross_entropy_sum
    tokens = torch.randint(0, 64, (2, 17), generator=torch.Generator().manual_seed(0))
    loss = loss_fn(model(tokens[:, :-1]), tokens[:, 1:])
    loss.backward()
    return loss.detach(), {
        n.replace("_checkpoint_wrapped_module.", ""): p.grad for n, p in model.named_parameters()
    }


@pytest.mark.parametrize(
    "backend,mode",
    [("eager", "none"), ("aot_eager", "none"), ("aot_eager", "selective"), ("aot_eager", "full")],
)
def test_compiled_blocks_and_loss_give_bitwise_the_eager_loss_and_gradients(backend, mode):
    ref_loss, ref_grads = _step(None)
    loss, grads = _step(backend, mode)
    assert torch.equal(loss, ref_loss)
    assert [n for n in grads if not torch.equal(grads[n], ref_grads[n])] == []


def test_loss_is_not_compiled_when_disabled_or_not_listed():
    assert build_loss_fn(parse_args([]), CPU) is cross_entropy_sum
    only_model = parse_args(
        ["--compile.enable", "--compile.backend=eager", "--compile.components=model"]
    )
    assert build_loss_fn(only_model, CPU) is cross_entropy_sum


def test_no_cpp_compiler_falls_back_to_eager_with_one_warning_line_and_the_same_loss(
    monkeypatch, capsys, one_rank_group
):
    monkeypatch.setattr(compile_module.shutil, "which", lambda name: None)
    run = parse_run(
        [
            "--compile.enable",
            "--compile.backend=inductor",
            "--training.seq_len=16",
            "--model.overrides.n_layers=2",
            "--model.overrides.dim=32",
            "--model.overrides.n_heads=4",
            "--model.overrides.n_kv_heads=2",
            "--model.overrides.head_dim=8",
            "--model.overrides.hidden_dim=48",
        ]
    )
    dims = ParallelDims(dp_shard=-1, world_size=1)
    dims.build_mesh("cpu")
    info = DistInfo(
        rank=0,
        world_size=1,
        local_rank=0,
        local_world_size=1,
        device=CPU,
        backend="gloo",
        dims=dims,
    )
    model, spec, args = build_model(run, info), run.spec, run.model_args
    loss_fn = build_loss_fn(run.config, CPU)
    init_weights(model, spec.init_plan(args), seed=0, buffer_device=CPU)
    tokens = torch.randint(0, args.vocab_size, (2, 17), generator=torch.Generator().manual_seed(0))
    loss = loss_fn(model(tokens[:, :-1]), tokens[:, 1:])
    with torch.no_grad():
        logits = model(tokens[:, :-1])
    assert loss_fn is cross_entropy_sum
    assert not any(
        hasattr(block, "_compiled_call_impl") and block._compiled_call_impl
        for block in model.layers.values()
    )
    assert torch.equal(loss.detach(), cross_entropy_sum(logits, tokens[:, 1:]))
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1  # the model and the loss asked; one line
    assert lines[0].startswith(
        "warning: torch.compile disabled, running eager: inductor compiles C++ on CPU and "
        "found none of ['g++'] on PATH; install g++"
    )


def test_a_backend_that_fails_at_its_first_call_falls_back_with_its_error_named(capsys):
    def broken(gm, example_inputs):
        raise RuntimeError("toolchain exploded")

    torch._dynamo.register_backend(broken, name="broken_for_test")
    assert compile_available("broken_for_test", "cpu") is False
    assert compile_available("broken_for_test", "cpu") is False
    (line,) = capsys.readouterr().err.splitlines()
    assert "torch.compile(backend='broken_for_test') failed on a probe" in line
    assert (
        "RuntimeError: toolchain exploded; fix the backend's toolchain, or set "
        "--compile.enable=false" in line
    )


def test_a_working_backend_is_used_without_a_warning(capsys):
    assert compile_available("eager", "cpu") is True
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize(
    "argv,key",
    [
        (
            ["--compile.backend=inductr"],
            "compile.backend (command line): unknown torch.compile backend 'inductr' "
            "(did you mean inductor?)",
        ),
        (
            ["--compile.components=model,optimizer"],
            "compile.components (command line): must be one of",
        ),
    ],
)
def test_config_rejects_an_unknown_backend_or_component_in_one_line(argv, key):
    with pytest.raises(ConfigError) as err:
        parse_args(argv)
    assert str(err.value).startswith(key) and "\n" not in str(err.value)

"""init_weights / materialize / init_report / fingerprint on one process; stream distinctness."""

import math

import pytest
import torch
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

import torchtitan_lite.init.apply as init_module
from torchtitan_lite.init import counter, keyed
from torchtitan_lite.init.apply import canonical_name, init_weights, materialize
from torchtitan_lite.init.fingerprint import model_fingerprint
from torchtitan_lite.init.report import init_report
from torchtitan_lite.init.spec import InitPlan, normal, ones, trunc_normal, zeros


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.wq = nn.Linear(64, 64, bias=False)
        self.w1 = nn.Linear(64, 96, bias=True)
        self.norm = nn.Parameter(torch.empty(64))


class Tiny(nn.Module):
    """Tied embedding/output, two blocks, a persistent state buffer and a derived RoPE-like
    buffer."""

    def __init__(self, tie: bool = True):
        super().__init__()
        self.tok_embeddings = nn.Embedding(500, 64)
        self.layers = nn.ModuleDict({str(i): Block() for i in range(2)})
        self.output = nn.Linear(64, 500, bias=False)
        if tie:
            self.output.weight = self.tok_embeddings.weight
        self.register_buffer("tokens_seen", torch.empty(4))
        self.register_buffer("freqs", torch.empty(8), persistent=False)

    def init_buffers(self, buffer_device):
        self.freqs = 10000.0 ** (-torch.arange(8, dtype=torch.float32, device=buffer_device) / 8)


def plan(tie: bool = True) -> InitPlan:
    return InitPlan(
        "tiny",
        (
            ("tok_embeddings.weight", normal(1.0)),
            ("layers.*.wq.weight", trunc_normal(0.02)),
            ("layers.*.w1.weight", trunc_normal(0.03, cutoff=2.0)),
            ("layers.*.w1.bias", zeros()),
            ("layers.*.norm", ones()),
            ("tokens_seen", zeros()),
            ("output.weight", trunc_normal(0.02)),
        ),
    )


def build(tie: bool = True, wrap: bool = False) -> Tiny:
    with torch.device("meta"):
        model = Tiny(tie)
    if wrap:
        model.layers["0"] = checkpoint_wrapper(model.layers["0"])
    return materialize(model, "cpu")


def test_tied_output_spec_wins_and_tie_survives_meta_to_empty():
    model = build()
    result = init_weights(model, plan(), seed=0)
    assert model.output.weight is model.tok_embeddings.weight
    entry = result.table["output.weight"]
    assert entry.names == ("output.weight", "tok_embeddings.weight") and entry.spec == trunc_normal(
        0.02
    )
    assert "tok_embeddings.weight" not in result.table
    assert abs(model.output.weight.std().item() / (0.02 * 0.98658) - 1) < 0.02
    assert result.initialized_tensors == 10 and result.skipped_tensors == 0


def test_to_empty_alone_breaks_the_tie():
    with torch.device("meta"):
        model = Tiny()
    model.to_empty(device="cpu")
    assert model.output.weight is not model.tok_embeddings.weight


def test_counts_are_elements_of_distinct_tensors():
    model = build()
    result = init_weights(model, plan(), seed=0)
    expected = 500 * 64 + 2 * (64 * 64 + 96 * 64 + 96 + 64) + 4
    assert result.initialized_elements == expected


def test_nan_poisoned_model_has_no_nan_after_init():
    model = build()
    with torch.no_grad():
        for t in list(model.parameters()) + list(model.buffers()):
            t.fill_(math.nan)
    init_weights(model, plan(), seed=1)
    for name, t in list(model.named_parameters()) + list(model.named_buffers()):
        assert not torch.isnan(t).any(), name
    assert torch.equal(model.tokens_seen, torch.zeros(4)) and torch.equal(
        model.layers["1"].norm, torch.ones(64)
    )


def test_tensor_without_entry_raises_naming_it():
    bad = InitPlan("tiny", tuple(e for e in plan().entries if e[0] != "layers.*.w1.bias"))
    with pytest.raises(
        ValueError, match=r"tensor layers\.0\.w1\.bias \(shape \(96,\)\) matches no entry"
    ):
        init_weights(build(), bad, seed=0)


def test_entry_matching_nothing_raises_naming_it():
    bad = InitPlan("tiny", plan().entries + (("layers.*.w9.weight", zeros()),))
    with pytest.raises(
        ValueError, match=r"entries \['layers\.\*\.w9\.weight'\] match no parameter"
    ):
        init_weights(build(), bad, seed=0)


def test_bad_seed_raises():
    with pytest.raises(ValueError, match=r"seed must be an int in \[0, 2\*\*64\), got 1.5"):
        init_weights(build(), plan(), seed=1.5)


def test_unknown_skip_name_raises():
    with pytest.raises(
        ValueError, match=r"skip names \['layers\.7\.wq\.weight'\] are not parameters"
    ):
        init_weights(build(), plan(), seed=0, skip={"layers.7.wq.weight"})


def test_digest_collision_raises(monkeypatch):
    monkeypatch.setattr(init_module, "name_digest", lambda name: b"\0" * 16)
    with pytest.raises(RuntimeError, match="name digest collision"):
        init_weights(build(), plan(), seed=0)


def _spy(monkeypatch):
    calls = []
    real = init_module.trunc_normal_

    def spy(tensor, *args, key, **kwargs):
        calls.append(key.name)
        return real(tensor, *args, key=key, **kwargs)

    monkeypatch.setattr(init_module, "trunc_normal_", spy)
    return calls


def test_fresh_init_draws_each_random_tensor_exactly_once(monkeypatch):
    calls = _spy(monkeypatch)
    init_weights(build(), plan(), seed=0)
    assert sorted(calls) == sorted(
        [
            "output.weight",
            "layers.0.wq.weight",
            "layers.1.wq.weight",
            "layers.0.w1.weight",
            "layers.1.w1.weight",
        ]
    )


def test_fully_loaded_model_draws_nothing_and_keeps_values(monkeypatch):
    model = build()
    init_weights(model, plan(), seed=0)
    before = {n: t.clone() for n, t in model.state_dict().items()}
    names = [n for n, _ in model.named_parameters(remove_duplicate=False)] + ["tokens_seen"]
    calls = _spy(monkeypatch)
    result = init_weights(model, plan(), seed=99, skip=names)
    assert calls == []
    assert (result.initialized_tensors, result.skipped_tensors) == (0, 10)
    assert result.skipped_elements == sum(t.numel() for t in set(model.parameters())) + 4
    assert all(torch.equal(before[n], t) for n, t in model.state_dict().items())


def test_skip_by_alias_skips_the_tied_group(monkeypatch):
    calls = _spy(monkeypatch)
    result = init_weights(build(), plan(), seed=0, skip={"tok_embeddings.weight"})
    assert "output.weight" not in calls and result.table["output.weight"].loaded


def test_wrappers_change_neither_names_nor_values():
    plain, wrapped = build(), build(wrap=True)
    assert any("_checkpoint_wrapped_module" in n for n, _ in wrapped.named_parameters())
    r1 = init_weights(plain, plan(), seed=5)
    r2 = init_weights(wrapped, plan(), seed=5)
    assert list(r1.table) == list(r2.table)
    assert model_fingerprint(plain) == model_fingerprint(wrapped)
    assert torch.equal(
        plain.layers["0"].wq.weight, wrapped.layers["0"]._checkpoint_wrapped_module.wq.weight
    )


def test_canonical_name_strips_compile_and_checkpoint_prefixes():
    name = "_orig_mod.layers.3._checkpoint_wrapped_module.attention.wq.weight"
    assert canonical_name(name) == "layers.3.attention.wq.weight"


def test_same_seed_same_weights_other_seed_other_weights():
    a, b, c = build(), build(), build()
    init_weights(a, plan(), seed=11)
    init_weights(b, plan(), seed=11)
    init_weights(c, plan(), seed=12)
    assert model_fingerprint(a) == model_fingerprint(b) != model_fingerprint(c)
    assert not torch.equal(a.layers["0"].wq.weight, a.layers["1"].wq.weight)


def test_init_buffers_recomputes_derived_buffer():
    model = build()
    init_weights(model, plan(), seed=0, buffer_device="cpu")
    assert torch.allclose(model.freqs, 10000.0 ** (-torch.arange(8) / 8))


def test_report_rows_match_theory_and_flag_anomalies():
    model = build(tie=False)
    untied = InitPlan("tiny", plan().entries[:-1] + (("output.weight", trunc_normal(0.02)),))
    result = init_weights(model, untied, seed=0)
    report = init_report(model, untied, result)
    rows = {r.name: r for r in report.rows}
    assert all(r.flags == [] for r in report.rows), str(report)
    wq = rows["layers.0.wq.weight"]
    assert wq.expected_std == pytest.approx(0.02 * 0.98658, rel=1e-4) and wq.at_bound == 0.0
    assert abs(rows["tok_embeddings.weight"].std - 1.0) < 0.02
    with torch.no_grad():
        model.layers["0"].wq.weight[0, 0] = math.nan
        model.layers["1"].wq.weight[:4] = (
            0.06  # the +3 sigma bound: what fp32 inverse-CDF samplers do
        )
        model.output.weight.mul_(2.0)
    rows = {r.name: r for r in init_report(model, untied, result).rows}
    assert rows["layers.0.wq.weight"].flags == ["nan/inf"]
    assert rows["layers.1.wq.weight"].flags == ["mass at bounds"]
    assert rows["layers.1.wq.weight"].at_bound == pytest.approx(4 / 64)
    assert rows["output.weight"].flags == ["std off"]
    assert "name" in str(init_report(model, untied, result)).splitlines()[0]


def test_report_json_round_trip(tmp_path):
    import json

    model = build()
    result = init_weights(model, plan(), seed=0)
    init_report(model, plan(), result).write_json(tmp_path / "r.json")
    rows = json.loads((tmp_path / "r.json").read_text())
    assert [r["name"] for r in rows][:2] == ["output.weight", "layers.0.norm"]
    assert rows[0]["status"] == "tied" and rows[0]["excess_kurtosis"] == pytest.approx(
        -0.171, abs=0.1
    )


def qwen3_8b_shapes() -> dict[str, tuple[int, ...]]:
    """Parameter names and shapes of the Qwen3-8B flavor (36 layers, dim 4096, 32/8 heads of 128,
    ffn 12288, vocab 151936, untied), as in the Qwen3-8B config.json."""
    dim, head_dim, n_heads, n_kv_heads, ffn, vocab = 4096, 128, 32, 8, 12288, 151936
    shapes = {
        "tok_embeddings.weight": (vocab, dim),
        "norm.weight": (dim,),
        "output.weight": (vocab, dim),
    }
    for i in range(36):
        p = f"layers.{i}."
        shapes |= {
            p + "attention.wq.weight": (n_heads * head_dim, dim),
            p + "attention.wk.weight": (n_kv_heads * head_dim, dim),
            p + "attention.wv.weight": (n_kv_heads * head_dim, dim),
            p + "attention.wo.weight": (dim, n_heads * head_dim),
            p + "attention.q_norm.weight": (head_dim,),
            p + "attention.k_norm.weight": (head_dim,),
            p + "feed_forward.w1.weight": (ffn, dim),
            p + "feed_forward.w2.weight": (dim, ffn),
            p + "feed_forward.w3.weight": (ffn, dim),
            p + "attention_norm.weight": (dim,),
            p + "ffn_norm.weight": (dim,),
        }
    return shapes


def test_qwen3_8b_tensors_have_distinct_streams_and_seeds_share_none():
    """Every tensor of Qwen3-8B under seeds 1234 and 1235 has its own 96-bit stream (Philox key and
    counter salt), so no two tensors, and no two seeds, share a value sequence."""
    shapes = qwen3_8b_shapes()
    assert abs(sum(math.prod(s) for s in shapes.values()) / 1e9 - 8.19) < 0.01
    streams = [
        counter.stream_words(seed, keyed.name_digest(name))
        for seed in (1234, 1235)
        for name in shapes
    ]
    assert len(streams) == 2 * len(shapes) == 2 * 399
    assert len(set(streams)) == len(streams)

"""Multi-token prediction (issue 34, ``models/common/mtp.py``): the 671b parameter count with the
published MTP layer derived from config.json's fields, the loss and gradients against a
re-implementation of the report's equations (sec. 2.2, with vLLM's ``deepseek_mtp.py`` order of the
concatenation), the init plan, the Hugging Face layer-61-style tensors both ways, and the refusal of
tensor and pipeline parallelism before launch."""

from __future__ import annotations

import dataclasses
import re

import pytest
import torch
import torch.nn.functional as F
from ckpt_helpers import text_file
from hf_reference import random_ours
from model_helpers import assert_plan_covers_exactly, build_random, rms_norm, train_to_the_end

from torchtitan_lite.components.hf.export import export_hf
from torchtitan_lite.components.hf.folder import SafetensorsFolder
from torchtitan_lite.components.hf.load import load_hf_folder
from torchtitan_lite.data.tokenizer import BUNDLED_TOKENIZER, Tokenizer
from torchtitan_lite.init.apply import materialize
from torchtitan_lite.models import get_model_spec
from torchtitan_lite.models.deepseek_v3.args import deepseek_v3_flavors
from torchtitan_lite.preflight.checks import ConfigError, load_run, parse_run

SPEC = get_model_spec("deepseek_v3")
TINY = dataclasses.replace(
    deepseek_v3_flavors["debug"],
    dim=64,
    n_layers=2,
    n_heads=2,
    vocab_size=128,
    hidden_dim=96,
    moe_inter_dim=32,
    kv_lora_rank=16,
    qk_nope_head_dim=16,
    qk_rope_head_dim=8,
    v_head_dim=16,
    max_seq_len=64,
    rope_original_max_seq_len=64,
    mtp_num_layers=2,
    mtp_loss_scaling_factor=0.3,
    aux_loss_coeff=0.0,
    bias_update_speed=0.0,
)


def test_671b_with_one_mtp_layer_has_the_published_count_derived_from_config_json():
    # deepseek-ai/DeepSeek-V3 config.json: hidden_size 7168, q_lora_rank 1536, kv_lora_rank 512,
    # heads 128,
    # qk_nope 128, qk_rope 64, v_head 128, n_routed_experts 256, n_shared_experts 1,
    # moe_intermediate_size 2048,
    # vocab 129280, num_nextn_predict_layers 1 (a MoE block: index 61 >= first_k_dense_replace 3).
    d, h, experts, inter, vocab = 7168, 128, 256, 2048, 129280
    attention = (
        d * 1536
        + 1536
        + 1536 * h * 192
        + d * (512 + 64)
        + 512
        + 512 * h * (128 + 128)
        + h * 128 * d
    )
    block = attention + 2 * d + d * experts + experts * 3 * d * inter + 3 * d * inter
    mtp_layer = block + 2 * d * d + 3 * d  # + eh_proj, enorm, hnorm, shared_head.norm
    assert mtp_layer == 11_610_067_968
    with torch.device("meta"):
        model = SPEC.model_cls(dataclasses.replace(deepseek_v3_flavors["671b"], mtp_num_layers=1))
    total = sum(p.numel() for p in model.parameters())
    assert total == 671_026_404_352 + mtp_layer
    # The checkpoint also stores the 59 MoE layers' e_score_correction_bias (a buffer here) and the
    # MTP layer's copies
    # of the embedding and head: 684.49B weights (the hub's "685B" also counts the FP8
    # weight_scale_inv tensors).
    stored = total + 59 * experts + 2 * vocab * d
    assert stored == 684_489_845_504


def reference_mtp_loss(
    model, tokens: torch.Tensor, labels: torch.Tensor
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The main cross-entropy mean plus lambda / D * sum_k L^k, and each depth's summed
    cross-entropy, written from the report's eq. 21-25 and vLLM's DeepSeekMultiTokenPredictorLayer
    (cat[enorm(emb), hnorm(h)], the block, the head's norm, the shared lm_head), using our main
    blocks and MTP blocks as black boxes."""
    a = model.args
    bs, s = tokens.shape
    cos, sin = model.rope_cos[:s], model.rope_sin[:s]
    h = model.tok_embeddings.weight[tokens]
    for layer in model.layers.values():
        h = layer(h, cos, sin)
    h = rms_norm(
        h, model.norm.weight, a.norm_eps
    )  # h^0: the main model's output after its final norm
    head = model.output.weight
    main = F.cross_entropy((h @ head.T).flatten(0, 1), labels.flatten(), reduction="sum")
    sums = []
    for k in range(1, a.mtp_num_layers + 1):
        m = model.mtp.layers[str(k - 1)]
        n = s - k
        emb = model.tok_embeddings.weight[tokens[:, k:]]  # Emb(t_{i+k}), i < s - k
        x = torch.cat(
            [
                rms_norm(emb, m.enorm.weight, a.norm_eps),
                rms_norm(h[:, :n], m.hnorm.weight, a.norm_eps),
            ],
            -1,
        )
        h = m.block(x @ m.eh_proj.weight.T, cos[:n], sin[:n])
        logits = rms_norm(h, m.norm.weight, a.norm_eps) @ head.T
        sums.append(
            F.cross_entropy(logits.flatten(0, 1), labels[:, k:].flatten(), reduction="sum")
        )  # t_{i+k+1}
    total = main / (bs * s) + a.mtp_loss_scaling_factor / a.mtp_num_layers * sum(sums) / (bs * s)
    return total, sums


def test_mtp_loss_and_gradients_equal_the_report_equations():
    model = build_random(SPEC.model_cls, TINY, seed=3, std=0.1).train()
    tokens = torch.randint(0, TINY.vocab_size, (2, 20), generator=torch.Generator().manual_seed(1))
    labels = torch.randint(0, TINY.vocab_size, (2, 20), generator=torch.Generator().manual_seed(2))
    main = F.cross_entropy(
        model(tokens, labels=labels).flatten(0, 1), labels.flatten(), reduction="sum"
    )
    (main / labels.numel()).backward()
    ours = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    stats = model.mtp.take_stats()
    model.zero_grad(set_to_none=True)
    total, sums = reference_mtp_loss(model, tokens, labels)
    total.backward()
    torch.testing.assert_close(
        stats, torch.stack([*[x.detach() for x in sums], torch.tensor(40.0)]), rtol=1e-6, atol=1e-4
    )
    assert ours.keys() == {name for name, p in model.named_parameters() if p.grad is not None}
    for name in (
        "mtp.layers.0.eh_proj.weight",
        "mtp.layers.1.enorm.weight",
        "mtp.layers.1.block.attention.wo.weight",
        "tok_embeddings.weight",
        "output.weight",
        "layers.0.attention.wkv_a.weight",
    ):
        torch.testing.assert_close(ours[name], model.get_parameter(name).grad, rtol=1e-5, atol=1e-7)
    assert ours["mtp.layers.1.eh_proj.weight"].abs().sum() > 0


def test_mtp_is_off_in_eval_and_without_labels():
    model = build_random(SPEC.model_cls, TINY, seed=3, std=0.1)
    tokens = torch.randint(0, TINY.vocab_size, (1, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        plain = model.eval()(tokens, labels=tokens)
        assert model.mtp.stats is None
        assert torch.equal(model.train()(tokens), plain)
    assert model.mtp.stats is None


def test_init_plan_covers_the_mtp_modules_exactly():
    with torch.device("meta"):
        model = SPEC.model_cls(TINY)
    names = assert_plan_covers_exactly(model, SPEC.init_plan(TINY))
    assert (
        "mtp.layers.1.block.moe.router.expert_bias" in names
        and "mtp.layers.0.eh_proj.weight" in names
    )


def test_flops_count_the_mtp_depths():
    off = dataclasses.replace(TINY, mtp_num_layers=0)
    one = dataclasses.replace(TINY, mtp_num_layers=1)
    base = SPEC.num_flops_per_token(off, 32)
    a = TINY
    block = (
        SPEC.num_flops_per_token(dataclasses.replace(off, n_layers=a.n_layers + 1), 32) - base
    )  # one MoE block
    extra = (
        31
        / 32
        * (
            block
            - 6 * a.n_heads * (a.qk_head_dim + a.v_head_dim) * 32
            + 6 * (2 * a.dim * a.dim + 3 * a.dim + a.dim * a.vocab_size)
            + 6 * a.n_heads * (a.qk_head_dim + a.v_head_dim) * 31
        )
    )
    assert SPEC.num_flops_per_token(one, 32) == pytest.approx(base + extra, rel=1e-12)


def test_hf_folder_with_mtp_layers_round_trips_and_loads_with_mtp_off(tmp_path):
    model, adapter = random_ours("deepseek_v3", TINY, seed=4)
    export_hf(model, str(tmp_path / "hf"), adapter, Tokenizer(BUNDLED_TOKENIZER))
    files = SafetensorsFolder(str(tmp_path / "hf"))
    names = files.names()
    n = TINY.n_layers
    for k in range(2):
        for hf in (
            "enorm.weight",
            "hnorm.weight",
            "eh_proj.weight",
            "shared_head.norm.weight",
            "embed_tokens.weight",
            "shared_head.head.weight",
            "self_attn.kv_a_proj_with_mqa.weight",
            "mlp.experts.7.down_proj.weight",
            "mlp.gate.e_score_correction_bias",
        ):
            assert f"model.layers.{n + k}.{hf}" in names
    box = tuple((0, s) for s in names["lm_head.weight"])
    assert torch.equal(
        files.read(f"model.layers.{n + 1}.shared_head.head.weight", box),
        files.read("lm_head.weight", box),
    )

    with torch.device("meta"):
        back = SPEC.model_cls(TINY)
    materialize(back, "cpu")
    result = load_hf_folder(back, str(tmp_path / "hf"), "deepseek_v3", TINY)
    assert result.missing == [] and result.unexpected == []
    assert set(result.skipped) == {
        f"model.layers.{n + k}.{t}"
        for k in range(2)
        for t in ("embed_tokens.weight", "shared_head.head.weight")
    }
    theirs = dict(back.state_dict())
    assert [
        name
        for name, t in model.state_dict().items()
        if "tokens_per_expert" not in name and not torch.equal(t, theirs[name])
    ] == []

    off = dataclasses.replace(TINY, mtp_num_layers=0)
    with torch.device("meta"):
        plain = SPEC.model_cls(off)
    materialize(plain, "cpu")
    result = load_hf_folder(plain, str(tmp_path / "hf"), "deepseek_v3", off)
    assert result.missing == [] and result.unexpected == []
    assert all(
        name.startswith((f"model.layers.{n}.", f"model.layers.{n + 1}.")) for name in result.skipped
    )
    assert "mtp_num_layers=2" in result.skipped[f"model.layers.{n}.eh_proj.weight"]


@pytest.mark.parametrize(
    "option", ["--parallelism.tensor_parallel_degree=2", "--parallelism.pipeline_parallel_degree=2"]
)
def test_tensor_and_pipeline_parallelism_with_mtp_are_refused_before_launch(option):
    argv = [
        "--job.config_file",
        "train_configs/deepseek_v3_debug.toml",
        "--model.overrides.mtp_num_layers=1",
        option,
    ]
    missing = (
        "no tensor-parallel plan"
        if "tensor" in option
        else "they read the token embedding, which the first stage owns"
    )
    reason = f"mtp_num_layers 1\\): the MTP modules .*{missing}.*mtp_num_layers=0"
    with pytest.raises(ConfigError, match=reason):
        load_run(argv, world_size=2)


def test_the_step_1_check_covers_the_mtp_depth_and_passes(tmp_path, capsys):
    text_file(tmp_path, n_plays=1)
    argv = [
        "--job.config_file=train_configs/deepseek_v3_debug.toml",
        "--model.overrides.mtp_num_layers=1",
        "--model.overrides.n_layers=2",
        "--training.seq_len=64",
        "--training.local_batch_size=2",
        "--training.global_batch_size=2",
        "--training.steps=1",
        "--validation.enable=false",
        "--checkpoint.enable=false",
        "--metrics.enable_tensorboard=false",
        f"--training.dataset_path={tmp_path / 'data.txt'}",
        f"--job.dump_folder={tmp_path / 'out'}",
    ]
    train_to_the_end(parse_run(argv))
    lines = capsys.readouterr().out.splitlines()
    expected = next(line for line in lines if line.startswith("expected step-1 loss"))
    assert expected.endswith("; the same for MTP depth 1, per predicted token")
    check = next(line for line in lines if line.startswith("step-1 check"))
    pattern = r"step-1 check: loss [\d.]+ is .*; mtp depth 1 loss [\d.]+ is .*"
    assert re.fullmatch(pattern, check), check
    assert not [line for line in lines if "warning" in line]

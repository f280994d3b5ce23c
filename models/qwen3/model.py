"""Dense Qwen3 decoder (Qwen3 technical report, arXiv 2505.09388; HF transformers
``modeling_qwen3.py``).

Pre-norm blocks ``h = x + attention(attention_norm(x)); out = h + feed_forward(ffn_norm(h))``
(:class:`torchtitan_lite.models.common.dense_block.DenseBlock`) whose GQA attention has QK-norm
before RoPE (:class:`torchtitan_lite.models.common.attention.Attention`), a final ``norm`` and an
``output`` projection to the vocabulary. Parameter names follow torchtitan (``wq/wk/wv/wo``,
``w1/w2/w3``); ``__init__`` creates uninitialized tensors (see
``torchtitan_lite/protocols/model_spec.py``).
"""

from __future__ import annotations

from torchtitan_lite.models.common.decoder import Decoder
from torchtitan_lite.models.common.dense_block import DenseBlock
from torchtitan_lite.models.qwen3.args import Qwen3ModelArgs


class Qwen3Model(Decoder):
    """The Qwen3 decoder (:class:`torchtitan_lite.models.common.decoder.Decoder`) with
    :class:`~torchtitan_lite.models.common.dense_block.DenseBlock` blocks with QK-norm and plain
    RoPE over ``head_dim`` (base ``rope_theta``; tied embeddings in the 0.6b/1.7b/4b flavors).

    ``tokens`` int64 ``(bs, seqlen)`` -> logits ``(bs, seqlen, vocab_size)``.
    """

    def __init__(self, args: Qwen3ModelArgs):
        super().__init__(
            args, lambda a, _layer_id: DenseBlock(a, qk_norm=True), rope_dim=args.head_dim
        )

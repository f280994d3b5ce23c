"""Building blocks shared by the model families (no family imports another): the decoder scaffolding
and the dense block, norms, GQA attention, RoPE/YaRN, the args checks, one MoE layer (routers,
experts, token dispatch, balance losses, expert bias, training hooks), the shared parallelize body
and attention plan, the dense parameter and FLOP counts, and the Hugging Face pieces every adapter
uses (decoder names, attention keys, config reading)."""

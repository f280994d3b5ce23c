"""Building blocks shared by the model families (norms, attention, RoPE, MoE)."""

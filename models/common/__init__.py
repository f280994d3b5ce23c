"""Building blocks shared by the model families: the decoder scaffolding, norms, attention, RoPE/YaRN, the args
checks, one MoE layer (routers, experts, token dispatch, balance losses, expert bias, training hooks) and the
shared parallelize body."""

"""Where and how the model runs: devices (``devices.py``), the process group (``process_group.py``),
and the parallelisms applied to a model: activation checkpointing, compile, FSDP2."""

"""The launcher of ``run_train.sh`` (``python -m torchtitan_lite.launch``): the config check,
torchrun's agent, stop requests and the run's last line. Torch-free but for the agent, so that a
signal finds it ready."""

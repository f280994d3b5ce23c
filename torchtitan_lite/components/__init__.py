"""Pieces of a training run: optimizer, LR schedule, checkpoints, Hugging Face import/export,
metrics and TensorBoard, faults, profiling."""

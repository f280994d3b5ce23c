"""Training parts: optimizer, Muon, LR schedule, loss, checkpoints, Hugging Face import/export,
metrics and TensorBoard, profiling. The run's lifecycle is in ``lifecycle/``."""

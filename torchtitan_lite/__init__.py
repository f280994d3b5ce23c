"""torchtitan_lite: a compact, PyTorch-native framework for pretraining large language models."""

"""torchtitan_lite: a compact, PyTorch-native framework for pretraining large language models."""

from torchtitan_lite.threads import apply_to_entry_point

apply_to_entry_point()  # python -m <entry point>: the thread settings before torch loads

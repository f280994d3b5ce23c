"""Command-line tools beside training: ``python -m torchtitan_lite.tools.inspect_init`` and
``python -m torchtitan_lite.tools.compare_runs``."""

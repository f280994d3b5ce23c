"""Configuration, the ground floor: the schema (``schema.py``), its TOML/CLI machinery (``cli.py``),
loading a file and a command line into the dataclasses (``load.py``), I/O probes (``paths.py``) and
docs/configuration.md from the schema (``reference.py``). The checks that resolve and validate a run
live one floor up, in ``torchtitan_lite/preflight``."""

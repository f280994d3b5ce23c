"""Configuration: the schema (``schema.py``), its TOML/CLI machinery (``cli.py``) and the checks run before
any work starts (``preflight.py``; ``python -m torchtitan_lite.config``)."""

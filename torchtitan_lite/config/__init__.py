"""Configuration: the schema (``schema.py``), its TOML/CLI machinery (``cli.py``), and the checks run before any
work starts, load -> validate -> resolve (``checks.py``; ``python -m torchtitan_lite.config``): ``load.py`` reads
the file and command line, ``model_args.py`` resolves the model, each component checks its own section, and
``resolved.py`` hands the result to the workers."""

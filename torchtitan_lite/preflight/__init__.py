"""The preflight, the top floor under the entry points: load -> resolve -> check a run once before any work starts
(``checks.py``; ``python -m torchtitan_lite.preflight``): ``model_args.py`` resolves the model, each component
checks its own section, ``memory.py`` the per-rank estimate, and ``resolved.py`` hands the result to the workers."""

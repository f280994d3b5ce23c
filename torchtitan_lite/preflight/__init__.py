"""The preflight, the top floor under the entry points: load -> resolve -> check a run once before
any work starts (``checks.py``; ``python -m torchtitan_lite.preflight``): ``model_args.py`` resolves
the model, each component checks its own section, ``memory.py`` the per-rank estimate, ``run.py``
holds the result (:class:`~torchtitan_lite.preflight.run.ResolvedRun`) and ``resolved.py`` hands
it to the workers."""

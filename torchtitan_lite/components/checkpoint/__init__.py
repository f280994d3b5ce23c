"""Distributed checkpoints (DCP): :mod:`.checkpointer` saves and loads the training state (the
layout of a step folder is in its docstring), :mod:`.storage` keeps the checkpoint folder consistent
on disk, :mod:`.integrity` records and verifies the checksum of every file, :mod:`.meta` checks a
checkpoint's ``meta.json`` against this run, :mod:`.lock` lets one run at a time use a checkpoint
folder, :mod:`.checks` runs the checks before launch (which import no DCP: import the submodule you
need)."""

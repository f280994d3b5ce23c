"""Fixtures and settings shared by the whole test suite.

Helpers that are plain functions and constants live in modules beside this one (``dist_helpers``
launches processes and collects their results, ``ckpt_helpers`` the tiny training runs,
``model_helpers`` builds models, ``hf_reference``/``hf_published`` the transformers side).
"""

from __future__ import annotations

import os
import signal
import tempfile

import pytest
import torch
import torch.distributed as dist


def pytest_configure(config):
    """One CPU thread from the start (collection and the first module's fixtures), as every launched
    worker has (``dist_helpers.env``): what a test computes in its own process is computed as its
    workers compute, and the test process does not compete with its workers for the cores. Raw text
    is prepared into a cache of this session (``TORCHTITAN_LITE_DATA_CACHE``, inherited by launched
    workers), not the user's. Signals as under a shell (:func:`restore_signals`)."""
    torch.set_num_threads(1)
    os.environ.setdefault(
        "TORCHTITAN_LITE_DATA_CACHE", tempfile.mkdtemp(prefix="torchtitan_lite_data_cache_")
    )
    restore_signals()


def restore_signals():
    """Give this process the signal handling of a process started from a shell: pytest-xdist's
    workers (``-n``) start with SIGINT, SIGHUP and SIGQUIT ignored, and an ignored signal stays
    ignored across ``exec``, so the ``run_train.sh`` that a test signals (Ctrl-C under a
    pseudo-terminal) would never see it."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for sig in (signal.SIGHUP, signal.SIGQUIT):
        signal.signal(sig, signal.SIG_DFL)


@pytest.fixture(autouse=True)
def one_thread():
    """One CPU thread in every test, and again after it (a test or an in-process trainer may change
    it), so the fixtures set up for the next module run with one thread too."""
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(1)


@pytest.fixture
def one_rank_group():
    """A process group of this process alone (gloo, rank 0 of 1, an in-memory store) for the test,
    destroyed after it (unless the test did)."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    if dist.is_initialized():
        dist.destroy_process_group()


@pytest.fixture(scope="session")
def tokenizer_file(tmp_path_factory):
    """A byte-level BPE ``tokenizer.json`` of :data:`hf_published.SCALED_VOCAB` ids, the vocabulary
    of the scaled published configs (trained once per session; copy it into a folder that needs
    one)."""
    from hf_published import (
        SCALED_VOCAB,
    )  # here: hf_reference imports transformers, which most sessions never need
    from hf_reference import small_tokenizer

    return small_tokenizer(tmp_path_factory.mktemp("tok") / "tokenizer.json", SCALED_VOCAB)


def pytest_terminal_summary(terminalreporter):
    """Each test's ``("log", text)`` user property after the run, also from pytest-xdist's workers
    (``tests/test_slurm.py``: the test's wall seconds, the Slurm daemons' pids and ``sinfo``, added
    at its teardown)."""
    for reports in terminalreporter.stats.values():
        for report in reports:
            if getattr(report, "when", None) == "teardown":
                for name, text in report.user_properties:
                    if name == "log":
                        terminalreporter.write_line(f"{report.nodeid}: {text}")

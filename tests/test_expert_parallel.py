"""The all-to-all token dispatch of expert parallelism
(``torchtitan_lite/distributed/expert_parallel.py``) against one process, under routing skewed so
far that one rank receives no rows at all (``tests/dist_ep_worker.py``)."""

from __future__ import annotations

import pytest
from dist_helpers import REPO, launch

pytestmark = pytest.mark.multiprocess


def test_skewed_routing_with_an_idle_rank_gives_the_outputs_and_gradients_of_one_process():
    result = launch(REPO / "tests" / "dist_ep_worker.py", nproc=2, timeout=300).result()
    for experts in ("swiglu", "gpt_oss"):  # F.grouped_mm and the loop fallback
        got = result[experts]
        # rank 0 keeps 16 + 16 pairs for experts 0-1 and rank 1 sends it its 32; experts 2-3 on rank
        # 1 get none
        assert got["rows_received"] == [64, 0], experts
        assert got["out_and_input_grads"] < 1e-6, experts
        assert got["expert_grads"] < 1e-5, experts

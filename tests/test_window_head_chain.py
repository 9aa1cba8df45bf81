"""A decode window whose steps hand out blocks of the refused waiting head's hit chain
(``sim.replay.window_apply``): the head is looked up again from the pool after such a step, and the
window equals the plain loop (tables, prefix-cache stats, KV events, free queue); the spy checks
that such re-walks are actually played.
Interpreted only for the spy (a compiled window_apply is not patched); the equality runs either way."""

from __future__ import annotations

import pandas as pd
import pytest
from test_engine import CASES, _Linear, _sched, _workload

import sim.replay.step_runner as step_runner_mod
import sim.replay.window_apply as window_apply_mod
from sim.core.kv_cache_manager import KVCacheManager
from sim.replay.engine import Replay
from sim.timing.simulated_executor import SimulatedExecutor

BLOCKED = [2, 6, 0]  # test_engine's cases with blocked heads and tight pools


def _run(case: int, ff: bool, seed: int):
    sched = _sched(**{**CASES[case], "max_model_len": 4096}, algo="fast")
    replay = Replay(sched, SimulatedExecutor(_Linear()), _workload(seed, 150, rate=60.0), fast_forward=ff,
                    integrity_check=True, record_events=True)
    return replay.run(), sched


@pytest.mark.parametrize("case", BLOCKED)
@pytest.mark.parametrize("seed", [11, 12])
def test_windows_handing_out_the_heads_chain_equal_the_plain_loop(case: int, seed: int) -> None:
    (plain, s_plain), (fast, s_fast) = _run(case, False, seed), _run(case, True, seed)
    pd.testing.assert_frame_equal(plain.requests, fast.requests)
    pd.testing.assert_frame_equal(plain.steps, fast.steps)
    assert plain.prefix_cache == fast.prefix_cache
    assert [(s, repr(e)) for s, e in plain.events] == [(s, repr(e)) for s, e in fast.events]
    assert s_plain.kv_cache_manager.block_pool.free_block_ids() == s_fast.kv_cache_manager.block_pool.free_block_ids()


def test_re_walks_of_the_heads_chain_are_played(monkeypatch: pytest.MonkeyPatch) -> None:
    if not window_apply_mod.__file__.endswith(".py"):
        pytest.skip("window_apply is compiled: its calls cannot be spied on")
    state = {"in_window": False, "walks": 0, "windows": 0}
    walks_per_window: list[int] = []
    apply, lookup = window_apply_mod.apply_window, KVCacheManager.get_computed_blocks

    def spy_apply(scheduler, window):
        state["in_window"], state["walks"] = True, 0
        try:
            return apply(scheduler, window)
        finally:
            state["in_window"] = False
            walks_per_window.append(state["walks"])

    def spy_lookup(self, request):
        if state["in_window"]:
            state["walks"] += 1
        return lookup(self, request)

    monkeypatch.setattr(step_runner_mod, "apply_window", spy_apply)
    monkeypatch.setattr(KVCacheManager, "get_computed_blocks", spy_lookup)
    for case in BLOCKED:
        for seed in (11, 12):
            _run(case, True, seed)
    assert walks_per_window and max(walks_per_window) >= 2  # a window walked the head's chain again

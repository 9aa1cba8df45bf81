"""Decode windows with a CPU offload tier (``sim.replay.tier_window``) change nothing: the replay
with fast-forward equals the step-by-step one, table for table, for the tier's columns and counters
too; and windows do play (otherwise the equality would be empty)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pandas as pd
import pytest

import sim.replay.tier_window as tw
from sim.experiment.config import config_from_dict
from sim.experiment.run import replay_experiment


def _cfg(fast_forward: bool, **engine: Any) -> Any:
    return config_from_dict({
        "name": "tier_window", "seed": 3, "model": "llama-3-8b", "gpu": "H100-SXM",
        "engine": {"block_size": 16, "num_gpu_blocks": 700, "max_model_len": 4096, "num_cpu_blocks": 3000,
                   "max_num_batched_tokens": 2048, **engine},
        "latency": {"kind": "roofline"},
        "workload": {"kind": "chat", "sessions": 40, "turns": {"dist": "geometric", "mean": 4, "max": 8},
                     "system_prompt_tokens": 600, "max_context_tokens": 4000,
                     "user_tokens": {"dist": "lognormal", "median": 120, "sigma": 1.0, "min": 1, "max": 800},
                     "output_tokens": {"dist": "lognormal", "median": 60, "sigma": 0.8, "min": 1, "max": 300},
                     "think_time": {"dist": "exponential", "mean": 20},
                     "arrival": {"kind": "gamma", "rate": 2.0, "cv": 2.0}},
        "replay": {"fast_forward": fast_forward},
    }, "tier_window.yaml")


def _fast_equals_plain(make: Callable[..., Any], engine: dict[str, Any]) -> Any:
    """The replay of ``make(fast_forward, **engine)`` with fast-forward equals the one without:
    requests and steps exactly, and the tier's summary entries; the fast-forwarded result."""
    plain, _ = replay_experiment(make(False, **engine), progress=False)
    fast, _ = replay_experiment(make(True, **engine), progress=False)
    pd.testing.assert_frame_equal(fast.requests, plain.requests, check_exact=True)
    pd.testing.assert_frame_equal(fast.steps, plain.steps, check_exact=True)
    for key in ("prompt_tokens_by_source", "external_prefix_cache", "cpu_tier", "prefix_cache_hit_rate"):
        assert fast.summary[key] == plain.summary[key], key
    return fast


@pytest.mark.parametrize("engine", [
    {}, {"kv_offloading_policy": "arc"}, {"kv_offloading_block_size": 32},
    # prefills over several steps: windows whose prefilling tail offers chunks step by step
    {"max_num_batched_tokens": 256}, {"max_num_batched_tokens": 512, "kv_offloading_policy": "arc"},
    {"max_num_batched_tokens": 384, "kv_offloading_block_size": 32, "num_cpu_blocks": 400},
])
def test_windows_with_a_tier_equal_the_plain_loop(engine: dict[str, Any]) -> None:
    fast = _fast_equals_plain(_cfg, engine)
    assert fast.summary["prompt_tokens_by_source"]["external_kv_transfer"] > 0  # the tier is used


def test_windows_do_play_with_a_quiet_connector() -> None:
    from sim.experiment.engine_description import resolve
    from sim.experiment.kv_worker import build_kv_worker
    from sim.experiment.run import build_scheduler, simulated_executor
    from sim.experiment.workload import build_workload
    from sim.replay.engine import Replay

    cfg = _cfg(True)
    engine = resolve(cfg)
    sched = build_scheduler(engine)
    replay = Replay(sched, simulated_executor(cfg, sched), build_workload(cfg, engine).requests,
                    kv_worker=build_kv_worker(engine))
    replay.run()
    assert replay.num_window_steps > replay.num_plain_steps  # most steps are quiet decodes


@pytest.mark.skipif(not str(tw.__file__).endswith(".py"), reason="sim.replay.tier_window is compiled (mypyc): "
                    "its calls to _offerers bypass the module attribute the spy replaces")
def test_windows_play_prefill_offers_and_finished_commits(monkeypatch: pytest.MonkeyPatch) -> None:
    """Windows do play a prefilling tail's offers, and the commit of requests that finished in the
    step before (else the equality above would not cover them). Runs interpreted (the main tree)."""

    seen = {"offers": 0, "commits": 0}
    offerers = tw._offerers

    def spy(sched: Any, tier: Any, window: Any) -> Any:
        out = offerers(sched, tier, window)
        seen["offers"] += bool(out)
        seen["commits"] += out is not None and bool(tier.connector._finished_order)
        return out

    monkeypatch.setattr(tw, "_offerers", spy)
    replay_experiment(_cfg(True, max_num_batched_tokens=256), progress=False)
    assert seen["offers"] > 0 and seen["commits"] > 0


def _mooncake(fast_forward: bool, **engine: Any) -> Any:
    return config_from_dict({
        "name": "tier_window_mooncake", "gpu": "H100-SXM",
        "engine": {"block_size": 16, "max_model_len": 32768, **engine},
        "workload": {"kind": "mooncake", "limit": 200}, "replay": {"fast_forward": fast_forward},
    }, "tier_window_mooncake.yaml")


# Mooncake's first requests with a small GPU pool: waiting heads refused by the full-sequence gate
# while prefilling tails offer chunks and stores are in flight (windows that look the head up)
MOONCAKE_ENGINES = [{"num_gpu_blocks": 3000, "num_cpu_blocks": 5000},
                    {"num_gpu_blocks": 6000, "num_cpu_blocks": 3000, "max_num_batched_tokens": 1024}]


@pytest.mark.parametrize("engine", MOONCAKE_ENGINES)
def test_windows_that_look_the_head_up_beside_offers_equal_the_plain_loop(engine: dict[str, Any]) -> None:
    _fast_equals_plain(_mooncake, engine)


@pytest.mark.skipif(not str(tw.__file__).endswith(".py"), reason="sim.replay.tier_window is compiled (mypyc): "
                    "its calls to _offers_reach_head bypass the module attribute the spy replaces")
def test_windows_look_the_head_up_beside_offers(monkeypatch: pytest.MonkeyPatch) -> None:
    """The Mooncake cases above do play windows whose prefilling tail offers chunks while the waiting
    head is looked up with stores in flight (else their equality would not cover them)."""
    allowed = {"n": 0}
    reach = tw._offers_reach_head

    def spy(sched: Any, tier: Any, offerers: list[Any]) -> bool:
        out = reach(sched, tier, offerers)
        allowed["n"] += bool(offerers) and not out
        return out

    monkeypatch.setattr(tw, "_offers_reach_head", spy)
    for engine in MOONCAKE_ENGINES:
        replay_experiment(_mooncake(True, **engine), progress=False)
    assert allowed["n"] > 0

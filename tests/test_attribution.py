"""Miss attribution (sim.replay.attribution): one hand-made trace per cause with its exact tokens,
the count-based summary level against the per-block full level, and the blocks table."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from sim.core.config import CacheConfig, SchedulerConfig
from sim.core.hashing import make_block_hasher
from sim.core.kv_cache_spec import KVGroupSpec
from sim.core.scheduler import Scheduler
from sim.replay.attribution_records import CAUSES, REQUEST_MISS_COLUMNS
from sim.replay.engine import Replay
from sim.timing.latency import FixedLatency
from sim.timing.simulated_executor import SimulatedExecutor
from workloads.trace_format import TraceRequest

BS = 4


def sched(num_blocks: int = 1000, block_size: int = BS, caching: bool = True, groups=(), eagle=False, **kw):
    kw.setdefault("max_model_len", 512)
    cache = CacheConfig(block_size, num_blocks, enable_prefix_caching=caching, kv_groups=tuple(groups),
                        use_eagle=eagle)
    return Scheduler(SchedulerConfig(**kw), cache, make_block_hasher("sha256", block_size))


def req(rid: str, arrival: float, tokens, out: int = 1, **kw) -> TraceRequest:
    return TraceRequest(rid, arrival, np.asarray(tokens, dtype=np.int64), out, **kw)


def replay(reqs, make=sched, level: str = "full", on_step=None, **kw) -> tuple[pd.DataFrame, dict, pd.DataFrame | None]:
    res = Replay(make(**kw), SimulatedExecutor(FixedLatency(0.01)), reqs, integrity_check=True, attribution=level,
                 on_step=on_step).run()
    return res.requests.set_index("request_id"), res.summary, res.blocks


def misses(reqs, **kw) -> dict[str, dict[str, int]]:
    """Per request, its non-zero causes (top level and isolation split); both levels must agree."""
    out = []
    for level in ("full", "summary"):
        r, _, _ = replay(reqs, level=level, **kw)
        out.append({rid: {c[5:-7]: int(v) for c, v in row[list(REQUEST_MISS_COLUMNS)].items() if v}
                    for rid, row in r.iterrows()})
    assert out[0] == out[1], "summary level (set counts) != full level (per-block rule)"
    return out[0]


P = list(range(100, 117))  # 17 tokens: 4 full blocks of 4 + 1


def test_cold_and_partial_block():
    assert misses([req("a", 0, P)]) == {"a": {"partial_block": 1, "cold": 16}}


def test_last_token_recomputes_the_last_block_of_a_fully_cached_prompt():
    m = misses([req("a", 0, P[:16]), req("b", 1, P[:16])])
    assert m["b"] == {"last_token": 4}
    r, _, _ = replay([req("a", 0, P[:16]), req("b", 1, P[:16])])
    assert r.loc["b", "hit_tokens"] == 12


def test_skip_prompt_logprobs_and_caching_off():
    assert misses([req("a", 0, P), req("b", 1, P, prompt_logprobs=True)])["b"] == {"skip": 17}
    assert misses([req("a", 0, P), req("b", 1, P)], caching=False) == {"a": {"skip": 17}, "b": {"skip": 17}}


def test_isolation_names_the_key_that_differs():
    m = misses([req("a", 0, P), req("s", 1, P, salt="tenant-b"), req("l", 2, P, lora="sql")])
    assert m["s"] == {"partial_block": 1, "isolation": 16, "isolation_salt": 16}
    assert m["l"] == {"partial_block": 1, "isolation": 16, "isolation_lora": 16}
    # a plain request after a salted one: isolated from the salted namespace
    m = misses([req("s", 0, P, salt="x"), req("a", 1, P)])
    assert m["a"] == {"partial_block": 1, "isolation": 16, "isolation_salt": 16}
    # two salts: the second salted request is isolated from the first
    m = misses([req("s", 0, P, salt="x"), req("t", 1, P, salt="y"), req("u", 2, P, salt="y")])
    assert m["t"] == {"partial_block": 1, "isolation": 16, "isolation_salt": 16}
    assert m["u"] == {"partial_block": 1}  # hits its own namespace


def test_isolation_detail_names_the_other_namespace():
    _, s, blocks = replay([req("a", 0, P), req("s", 1, P, salt="tenant-b")])
    rows = blocks[blocks.request_id == "s"]
    assert list(rows.cause) == ["isolation_salt"] * 4 + ["partial_block"]
    assert set(rows.other_namespace.dropna()) == {"no salt, no LoRA"}
    assert set(rows.other_request.dropna()) == {"a"}
    assert s["miss_attribution"]["isolation"] == 16 and s["miss_attribution_isolation"] == {"salt": 16, "lora": 0,
                                                                                             "mm": 0}


def test_in_flight_a_chunked_prefill_race():
    # a computes 4 tokens a step (long_prefill_token_threshold), b (same prompt) is admitted in
    # a's first step: a's block 0 is cached at schedule time, blocks 1..3 are still to come
    kw = dict(long_prefill_token_threshold=4, max_num_batched_tokens=64)
    m = misses([req("a", 0, P), req("b", 0, P)], **kw)
    assert m["b"] == {"partial_block": 1, "in_flight": 12}
    _, _, blocks = replay([req("a", 0, P), req("b", 0, P)], **kw)
    rows = blocks[blocks.request_id == "b"]
    assert list(rows.cause) == ["hit", "in_flight", "in_flight", "in_flight", "partial_block"]
    assert set(rows.in_flight_by.dropna()) == {"a"}


def test_evicted_names_when_and_for_whom():
    # 4 usable blocks: c's 4 blocks evict a's cached ones before b looks a's prompt up
    reqs = [req("a", 0, P[:9]), req("c", 1, list(range(500, 513))), req("b", 2, P[:9])]
    assert misses(reqs, num_blocks=5)["b"] == {"partial_block": 1, "evicted": 8}
    r, s, blocks = replay(reqs, num_blocks=5)
    assert s["miss_attribution"]["evicted"] == 8
    rows = blocks[(blocks.request_id == "b") & (blocks.cause == "evicted")]
    assert list(rows.cached_by) == ["a", "a"] and list(rows.evicted_for) == ["c", "c"]
    assert set(rows.evict_reason) == {"reused"}
    assert (rows.evicted_step > rows.cached_step).all()


def test_unreachable_behind_an_evicted_head():
    # the head block of a's chain loses its key (BlockPool.evict_blocks) while block 1 stays cached
    def drop_head(s: Scheduler) -> None:
        pool = s.kv_cache_manager.block_pool
        cached = [b for b in pool.blocks if b.block_hash is not None]
        if len(cached) == 2 and s not in done:  # after a's first step: a's two full blocks, in chain order
            head = min(cached, key=lambda b: b.block_id)
            pool.evict_blocks([head.block_id])
            done.append(s)  # once per run

    done: list[Scheduler] = []

    reqs = [req("a", 0, P[:9]), req("b", 1, P[:9])]
    r, _, blocks = replay(reqs, on_step=drop_head)
    rows = blocks[blocks.request_id == "b"]
    assert list(rows.cause) == ["evicted", "unreachable", "partial_block"]
    assert rows.iloc[0].evict_reason == "evict_blocks"
    assert misses(reqs, on_step=drop_head)["b"] == {"partial_block": 1, "evicted": 4, "unreachable": 4}


def test_eagle_drops_the_last_matched_block():
    m = misses([req("a", 0, P), req("b", 1, P)], eagle=True)
    assert m["b"] == {"partial_block": 1, "eagle": 4}


def test_trace_given_answer_is_a_claimed_chain():
    # a's answer (given by the trace) is cached as it is generated; b extends a's turn
    ans = list(range(900, 908))
    a = req("a", 0, P[:8], out=9, output_token_ids=np.asarray(ans + [1], dtype=np.int64))
    b = req("b", 5, P[:8] + ans + [7])
    assert misses([a, b])["b"] == {"partial_block": 1}


def test_sliding_window_groups_sum_up():
    groups = (KVGroupSpec("full", BS), KVGroupSpec("sliding_window", BS, sliding_window=6))
    reqs = [req("a", 0, P), req("b", 1, P), req("c", 2, P[:9] + [1, 2, 3, 4, 5]), req("d", 3, P, salt="x")]
    m = misses(reqs, groups=groups, num_blocks=40)
    assert m["a"] == {"partial_block": 1, "cold": 16}
    assert m["b"] == {"partial_block": 1}
    assert m["d"] == {"partial_block": 1, "isolation": 16, "isolation_salt": 16}


def test_summary_keys_follow_the_causes_and_add_up():
    reqs = [req("a", 0, P), req("b", 1, P), req("s", 2, P, salt="x"), req("p", 3, P, prompt_logprobs=True)]
    r, s, blocks = replay(reqs, level="summary")
    assert blocks is None
    assert tuple(s["miss_attribution"]) == CAUSES
    assert sum(s["miss_attribution"].values()) == int((r.prompt_tokens - r.hit_tokens).sum())


def test_attribution_changes_no_result():
    reqs = [req(f"r{i}", 0.003 * i, P[: 5 + (i * 7) % 12] + [i % 3] * (i % 5), out=1 + i % 4,
                salt="x" if i % 4 == 0 else None) for i in range(30)]
    base, s0, _ = replay(reqs, level="off", num_blocks=12)
    for level in ("summary", "full"):
        r, s, _ = replay(reqs, level=level, num_blocks=12)
        pd.testing.assert_frame_equal(r[base.columns], base)
        assert {k: v for k, v in s.items() if not k.startswith("miss_")} == s0


def test_bad_level_is_refused():
    with pytest.raises(ValueError, match="attribution"):
        replay([req("a", 0, P)], level="yes")


def test_a_rejected_request_has_no_causes():
    r, s, _ = replay([req("a", 0, P), req("long", 1, list(range(600)))])
    assert r.loc["long", "status"] == "rejected" and r.loc["long", list(REQUEST_MISS_COLUMNS)].sum() == 0
    assert sum(s["miss_attribution"].values()) == 16 + 1

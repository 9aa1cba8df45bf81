"""Miss attribution with vLLM 0.33.0's CPU offload tier (sim.replay.attribution_tier): the tokens a
first admission loads from the tier are a hit source (``cpu_hit``), not a miss; a GPU-evicted block
the tier no longer holds is ``evicted`` (from both tiers); a block the tier holds behind a gap of its
run is ``unreachable``; one in the run but under a whole chunk past the GPU hit is
``cpu_partial_chunk``. Golden hand-built cases driven step by step (sim.core.step_driver, a stub
worker reporting each job one step later) with exact tokens per cause, both levels; the replay on the
clock end to end (tables, summary, ``apcsim explain``); a hypothesis property that every prompt token
is exactly one cause or hit source on random small tiered replays; untiered tables keep their
columns and keys."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sim.analysis.explain import explain, render
from sim.core.config import CacheConfig, OffloadConfig, SchedulerConfig
from sim.core.hashing import make_block_hasher
from sim.core.offload.step_worker import StepDelayWorker
from sim.core.request import Request
from sim.core.scheduler import Scheduler
from sim.core.step_driver import DriveResult, drive
from sim.core.version_profile import V0_33_0
from sim.replay.attribution import MissAttribution
from sim.replay.attribution_records import (
    BLOCK_COLUMNS,
    CAUSES,
    CODE_NAMES,
    REQUEST_MISS_COLUMNS,
    TIER_CAUSES,
    TIER_MISS_COLUMNS,
)
from sim.replay.engine import Replay
from sim.replay.kv_transfer import LinkKVWorker
from sim.timing.latency import FixedLatency
from sim.timing.simulated_executor import SimulatedExecutor
from sim.timing.transfer_link import TransferLink
from workloads.trace_format import TraceRequest

BS = 16
Spec = tuple[str, float, Sequence[int], int]  # id, arrival, prompt, output tokens


def drive_tier(
    reqs: Sequence[Spec], *, gpu: int, cpu: int, bpc: int = 1, full: bool = True, logprobs: Sequence[str] = ()
) -> tuple[DriveResult, MissAttribution]:
    h = make_block_hasher("sha256", BS)
    sched = Scheduler(
        SchedulerConfig(max_num_batched_tokens=256, max_model_len=4096, profile=V0_33_0),
        CacheConfig(block_size=BS, num_gpu_blocks=gpu, offload=OffloadConfig(cpu, blocks_per_chunk=bpc)),
        h,
    )
    attr = MissAttribution(sched, full=full)
    sched.kv_cache_manager.block_pool.observer = attr
    rs = [(t, Request(rid, list(toks), out, uid=i, hasher=h, prompt_logprobs=rid in logprobs))
          for i, (rid, t, toks, out) in enumerate(reqs)]
    return drive(sched, rs, worker=StepDelayWorker(1)), attr


def outcome(reqs: Sequence[Spec], **kw: Any) -> dict[str, tuple[int | None, int, dict[str, int]]]:
    """Per request: (GPU hit, CPU hit, non-zero causes), the same at both levels."""
    got = []
    for full in (True, False):
        res, attr = drive_tier(reqs, full=full, **kw)
        got.append({
            rid: (o.hit_tokens, o.external_hit_tokens,
                  {CODE_NAMES[i]: v for i, v in enumerate(attr.records.counts[rid]) if v})
            for rid, o in res.requests.items()
        })
    assert got[0] == got[1], "summary level (set counts) != full level (per-block rule)"
    return got[0]


def blocks(reqs: Sequence[Spec], rid: str, **kw: Any) -> list[tuple[str, Any, Any]]:
    """``rid``'s rows of blocks.parquet: (cause, cpu_chunk, cpu_state)."""
    res, attr = drive_tier(reqs, **kw)
    table = attr.records.blocks_table()
    assert table is not None and list(table.columns) == list(BLOCK_COLUMNS) + ["cpu_chunk", "cpu_state"]
    rows = table[table["request_id"] == rid].sort_values("block")
    return [(c, None if pd.isna(k) else int(k), None if pd.isna(s) else s)
            for c, k, s in zip(rows["cause"], rows["cpu_chunk"], rows["cpu_state"])]


X = list(range(64))  # 4 full blocks
FILLER = list(range(1000, 1113))  # 7 full blocks + 1: its allocation evicts X's blocks from a 9-block pool


def test_repeat_after_gpu_eviction_is_a_cpu_hit_not_a_miss() -> None:
    """a's chunks were stored to the tier; the filler evicts a's GPU blocks; b repeats a: GPU 0,
    CPU 64 (all four chunks), and only the trailing partial block misses."""
    reqs = [("a", 0, X + [999], 1), ("f", 1, FILLER, 1), ("b", 2, X + [999], 1)]
    m = outcome(reqs, gpu=9, cpu=64)
    assert m["a"] == (0, 0, {"partial_block": 1, "cold": 64})
    assert m["b"] == (0, 64, {"partial_block": 1})
    assert blocks(reqs, "b", gpu=9, cpu=64) == [("cpu_hit", j, "loaded") for j in range(4)] + [
        ("partial_block", None, None)]


def test_cpu_hit_covers_the_last_block_so_no_last_token() -> None:
    """[run] a 32-token prompt repeated: GPU 16 (capped at P - 1) + CPU 16 (the connector's lookup is
    bounded by P): nothing misses, not even the last block (vLLM counts it as external)."""
    m = outcome([("a", 0, X[:32], 2), ("b", 1, X[:32], 2)], gpu=64, cpu=64)
    assert m == {"a": (0, 0, {"last_token": 16, "cold": 16}), "b": (16, 16, {})}


def test_evicted_from_both_tiers() -> None:
    """A 9-chunk tier: storing the filler's 7 chunks evicts a's tail chunks 2 and 3 (LRU, a request's
    tail first); b loads chunks 0-1 and its blocks 2-3 are evicted from both tiers."""
    reqs = [("a", 0, X + [999], 1), ("f", 1, FILLER, 1), ("b", 2, X + [999], 1)]
    m = outcome(reqs, gpu=9, cpu=9)
    assert m["b"] == (0, 32, {"partial_block": 1, "evicted": 32})
    rows = blocks(reqs, "b", gpu=9, cpu=9)
    assert rows[:4] == [("cpu_hit", 0, "loaded"), ("cpu_hit", 1, "loaded"), ("evicted", None, None),
                        ("evicted", None, None)]


def test_cpu_run_stops_at_a_gap() -> None:
    """d repeats a's 64 tokens: GPU 48 + CPU 16, loading chunk 3, which its finish makes the tier's
    most recent; the filler's store then evicts chunk 2 only. b (a's chain + 1) loads chunks 0-1, block
    2 is evicted from both tiers, and block 3, held by the tier behind that gap, is unreachable."""
    reqs = [("a", 0, X, 1), ("d", 1, X, 1), ("f", 2, FILLER, 1), ("b", 3, X + [999], 1)]
    m = outcome(reqs, gpu=9, cpu=10)
    assert m["d"] == (48, 16, {})
    assert m["b"] == (0, 32, {"partial_block": 1, "evicted": 16, "unreachable": 16})
    rows = blocks(reqs, "b", gpu=9, cpu=10)
    assert rows[2:4] == [("evicted", None, None), ("unreachable", 3, "ready")]


def test_a_gpu_hit_inside_a_chunk_loads_nothing() -> None:
    """4 blocks per chunk: the filler evicts a's partial block and block 3 (freed tail first), so b's
    GPU hit is 48 tokens, inside chunk 0; the tier holds chunk 0, but 16 tokens are under one chunk
    (``hit < tokens_per_chunk -> 0``): block 3 is cpu_partial_chunk; block 4 was never computed."""
    reqs = [("a", 0, X + [999], 1), ("f", 1, list(range(1000, 1180)), 1), ("b", 2, X + list(range(2000, 2017)), 1)]
    m = outcome(reqs, gpu=16, cpu=64, bpc=4)
    assert m["b"] == (48, 0, {"partial_block": 1, "cold": 16, "cpu_partial_chunk": 16})
    assert blocks(reqs, "b", gpu=16, cpu=64, bpc=4)[3] == ("cpu_partial_chunk", 0, "ready")


def test_prompt_logprobs_reads_neither_tier() -> None:
    reqs = [("a", 0, X + [999], 1), ("f", 1, FILLER, 1), ("b", 2, X + [999], 1)]
    m = outcome(reqs, gpu=9, cpu=64, logprobs=("b",))
    assert m["b"] == (0, 0, {"skip": 65})


# -- the replay on the clock ------------------------------------------------------------------
def tier_sched(gpu: int, cpu: int, bpc: int = 1, policy: str = "lru", **kw: Any) -> Scheduler:
    kw.setdefault("max_model_len", 512)
    return Scheduler(
        SchedulerConfig(profile=V0_33_0, **kw),
        CacheConfig(BS, gpu, offload=OffloadConfig(cpu, blocks_per_chunk=bpc, policy=policy)),  # type: ignore[arg-type]
        make_block_hasher("sha256", BS),
    )


def replay(reqs: list[TraceRequest], sched: Scheduler, level: str = "full") -> Any:
    worker = LinkKVWorker(TransferLink(1000.0, 0.0), bytes_per_block=10**6) if sched.tier is not None else None
    return Replay(sched, SimulatedExecutor(FixedLatency(0.01)), reqs, integrity_check=True, attribution=level,
                  kv_worker=worker).run()


def treq(rid: str, arrival: float, tokens: Sequence[int], out: int = 1, **kw: Any) -> TraceRequest:
    return TraceRequest(rid, arrival, np.asarray(tokens, dtype=np.int64), out, **kw)


def test_replay_tables_summary_and_explain(tmp_path: Path) -> None:
    reqs = [treq("a", 0, X + [999]), treq("f", 1, FILLER), treq("b", 2, X + [999])]
    res = replay(reqs, tier_sched(9, 9))
    r = res.requests.set_index("request_id")
    assert list(r.columns[-len(TIER_MISS_COLUMNS):]) == list(TIER_MISS_COLUMNS)
    assert (r.loc["b", ["hit_tokens", "external_hit_tokens", "miss_evicted_tokens", "miss_partial_block_tokens"]]
            .tolist() == [0, 32, 32, 1])
    s = res.summary
    assert list(s["miss_attribution"]) == list(TIER_CAUSES)
    assert s["miss_attribution_hits"] == {"gpu_hit": 0, "cpu_hit": 32}
    assert sum(s["miss_attribution"].values()) + 32 == s["prompt_tokens"]
    assert s["prompt_tokens_by_source"]["external_kv_transfer"] == 32
    # what b's GPU miss became: untiered, its 64 tokens are evicted; tiered, 32 CPU hit + 32 evicted from both
    from test_attribution import sched

    plain = replay(reqs, sched(num_blocks=9, block_size=BS, profile=V0_33_0)).requests.set_index("request_id")
    assert plain.loc["b", ["hit_tokens", "miss_evicted_tokens"]].tolist() == [0, 64]
    res.requests.to_parquet(tmp_path / "requests.parquet")
    res.blocks.to_parquet(tmp_path / "blocks.parquet")
    e = explain(tmp_path, "b")
    assert (e["hit_tokens"], e["cpu_hit_tokens"], e["missed_tokens"]) == (0, 32, 33)
    assert e["miss_tokens"] == {"partial_block": 1, "evicted": 32}
    text = render(e, all_blocks=True)  # one line per block (the default groups a run of one cause)
    assert "0 GPU hit, 32 CPU hit, 33 missed" in text
    assert "loaded from the CPU tier (chunk 1)" in text and "evicted from both tiers" in text
    grouped = render(e)
    assert "loaded from the CPU tier (chunk 0)" in grouped and "evicted from both tiers" in grouped
    assert len(grouped.splitlines()) < len(text.splitlines())


def test_untiered_tables_and_summary_are_unchanged() -> None:
    """Without a tier: no tier column, block column or summary key; the causes are the untiered ones."""
    from test_attribution import sched

    res = replay([treq("a", 0, X + [999]), treq("b", 1, X + [999])], sched(block_size=BS))
    assert list(res.requests.columns[-len(REQUEST_MISS_COLUMNS):]) == list(REQUEST_MISS_COLUMNS)
    assert "miss_cpu_partial_chunk_tokens" not in res.requests and "external_hit_tokens" not in res.requests
    assert list(res.blocks.columns) == list(BLOCK_COLUMNS)
    assert list(res.summary["miss_attribution"]) == list(CAUSES) and "miss_attribution_hits" not in res.summary


def test_attribution_changes_no_tiered_result() -> None:
    reqs = [treq("a", 0, X + [999]), treq("f", 1, FILLER), treq("b", 2, X + [999]), treq("c", 2.001, X[:40])]
    off, on = (replay(reqs, tier_sched(9, 10), level) for level in ("off", "full"))
    cols = list(off.requests.columns)
    pd.testing.assert_frame_equal(off.requests, on.requests[cols])
    pd.testing.assert_frame_equal(off.steps, on.steps)


# -- property ---------------------------------------------------------------------------------
@dataclasses.dataclass
class Case:
    gpu: int
    cpu: int
    bpc: int
    policy: str
    config: dict[str, Any]
    requests: list[TraceRequest]


@st.composite
def cases(draw: Any) -> Case:
    bases = [draw(st.lists(st.integers(0, 20), min_size=n, max_size=n))
             for n in draw(st.lists(st.sampled_from([2 * BS + 1, 4 * BS, 6 * BS + 3, 8 * BS]), min_size=1, max_size=3))]
    is_async = draw(st.booleans())
    reqs, t = [], 0.0
    for i in range(draw(st.integers(2, 14))):
        base = bases[draw(st.integers(0, len(bases) - 1))]
        cut = draw(st.sampled_from([len(base), len(base), len(base) // 2, draw(st.integers(0, len(base)))]))
        slen = draw(st.sampled_from([0, 1, BS, 2 * BS + 3]))
        prompt = (base[:cut] + draw(st.lists(st.integers(0, 2), min_size=slen, max_size=slen))) or [7]
        t += draw(st.sampled_from([0.0, 0.005, 0.02, 0.2, 1.0]))
        logprobs = draw(st.integers(0, 19)) == 0
        reqs.append(treq(f"r{i}", t, prompt, draw(st.integers(1, 6)), prompt_logprobs=logprobs))
    need = -(-(max(len(r.tokens) for r in reqs) + 8) // BS) + 1
    return Case(
        gpu=draw(st.integers(need, need + 6)), cpu=draw(st.integers(1, 16)), bpc=draw(st.sampled_from([1, 2, 4])),
        policy=draw(st.sampled_from(["lru", "arc"])),
        config={"max_num_batched_tokens": draw(st.sampled_from([32, 64, 2048])),
                "max_num_seqs": draw(st.sampled_from([2, 16])), "async_scheduling": is_async},
        requests=reqs,
    )


@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
@given(case=cases())
def test_every_prompt_token_is_one_cause_or_hit_source(case: Case) -> None:
    """On every request of a random small tiered replay, GPU hit + CPU hit + the causes = the prompt
    tokens (integrity check on: the tables' check too), and both levels agree."""
    got = []
    for level in ("full", "summary"):
        res = replay(case.requests, tier_sched(case.gpu, case.cpu, case.bpc, case.policy, **case.config), level)
        r = res.requests.set_index("request_id")
        top = r[[f"miss_{c}_tokens" for c in TIER_CAUSES]].sum(axis=1)
        assert (top + r["hit_tokens"] + r["external_hit_tokens"] == r["prompt_tokens"]).all()
        assert sum(res.summary["miss_attribution"].values()) + sum(res.summary["miss_attribution_hits"].values()) \
            == res.summary["prompt_tokens"]
        got.append(r[list(TIER_MISS_COLUMNS)])
        if res.blocks is not None:  # one row per block; the hits are the GPU and CPU hit tokens
            b = res.blocks
            width = b["end"] - b["start"]
            for rid, row in r.iterrows():
                mine = b["request_id"] == rid
                assert width[mine].sum() == row["prompt_tokens"]
                assert width[mine & (b["cause"] == "cpu_hit")].sum() == row["external_hit_tokens"]
                assert width[mine & (b["cause"] == "hit")].sum() == row["hit_tokens"]
    pd.testing.assert_frame_equal(got[0], got[1])


@pytest.mark.parametrize("bpc", [1, 2])
def test_summary_level_matches_full_on_a_shared_prefix_mix(bpc: int) -> None:
    """A fixed mix of shared prefixes through a tight GPU pool and a small tier: both levels agree
    and the tier's causes all show up."""
    rng = np.random.default_rng(3)
    sys_prompt = list(range(96))
    reqs = [treq(f"r{i}", 0.05 * i, sys_prompt[: int(rng.integers(16, 96))] + list(rng.integers(200, 400, 20)), 2)
            for i in range(30)]
    got = [replay(reqs, tier_sched(24, 6, bpc), level).requests.set_index("request_id")[list(TIER_MISS_COLUMNS)]
           for level in ("full", "summary")]
    pd.testing.assert_frame_equal(got[0], got[1])


def test_explain_words_for_the_tier_causes() -> None:
    from sim.analysis.explain import why

    held = {"cpu_chunk": 3, "cpu_state": "ready"}
    assert why({"cause": "cpu_hit", "cpu_chunk": 2}, {}) == "loaded from the CPU tier (chunk 2) at admission"
    assert why({"cause": "cpu_partial_chunk", **held}, {}).startswith(
        "held by the CPU tier (chunk 3, ready), but the run past the GPU hit is under one chunk")
    assert "earlier block missed in both tiers" in why({"cause": "unreachable", **held}, {})
    assert "both tiers" not in why({"cause": "unreachable"}, {})  # cached on the GPU
    ev = {"cause": "evicted", "evict_reason": "reused", "evicted_step": 5, "evicted_block_id": 1, "evicted_for": "f"}
    assert why(ev, {}, tier=True).endswith("not in the CPU tier at this lookup (evicted from both tiers)")
    assert "CPU" not in why(ev, {})

"""The CPU tier's KV events against vLLM 0.33.0's own: every batch its ``Scheduler.update_from_output``
published (the block pool's events, then ``OffloadingConnector.take_events()``), recorded by
``tools/vllm_oracle/make_tier_event_fixtures.py`` for cases of the offload agreement manifest, in
vLLM's default (placeholder) and its ``self_describing_kv_events`` form.

apcsim runs the same case through ``sim.core.step_driver`` with the same hashing (``sha256``, seed
0: the same hash values) and tags each event with ``step_index`` as the fleet's pipeline does. A
synchronous engine's events of step s are vLLM's batch published after its ``schedule()`` call
s + 1 (``_publish_kv_events`` tags the tier's events with the step whose output it is); with async
scheduling apcsim batches the events of an ``update_from_output`` one step later than vLLM (as it
always did for the pool's), so only the stream is compared.

One thing is vLLM's own chance: a store job's keys are a ``set[bytes]`` (``TransferJobStatus.keys``),
so the order of one job's ``BlockStored`` events follows the process's bytes hashing
(``PYTHONHASHSEED``); apcsim emits them in chunk order. Runs of consecutive CPU ``BlockStored`` are
compared as sorted runs; everything else in its order.
"""

from __future__ import annotations

import json
from itertools import groupby
from pathlib import Path
from typing import Any

import pytest
from offload_fixture_engine import fixture_scheduler

from sim.core.config import CacheConfig
from sim.core.hashing import external_block_hash, make_block_hasher
from sim.core.kv_events import MEDIUM_CPU, BlockRemoved, BlockStored, KVCacheEvent, event_to_dict
from sim.core.offload.step_worker import StepDelayWorker
from sim.core.request import Request
from sim.core.scheduler import Scheduler
from sim.core.step_driver import drive

FIXTURES = Path(__file__).parent / "fixtures" / "vllm_oracle_033"
EVENTS = FIXTURES / "tier_events"
MANIFEST: dict[str, Any] = json.loads((FIXTURES / "offload" / "manifest.json").read_text())
CASES = ("scan_reuse_lru", "scan_reuse_arc", "preempt_resume", "pending_defer", "repeat32_async")
# vLLM 0.33.0 fields apcsim leaves out: unset for the CPU tier and the pool alike
ABSENT = {"locality": None, "ownership": None, "session_id": None, "lookahead_token_ids": None}


def engine(case: dict[str, Any], *, self_describing: bool = False) -> tuple[Scheduler, list[tuple[int, KVCacheEvent]]]:
    sched = fixture_scheduler(case, make_block_hasher("sha256", case["engine"]["block_size"]),
                              self_describing=self_describing)
    events: list[tuple[int, KVCacheEvent]] = []
    sched.kv_cache_manager.block_pool.event_sink = lambda ev: events.append((sched.step_index, ev))
    return sched, events


def run_case(name: str, self_describing: bool) -> tuple[list[tuple[int, KVCacheEvent]], Scheduler]:
    case = MANIFEST["cases"][name]
    sched, events = engine(case, self_describing=self_describing)
    hasher = sched.hasher
    rows = [json.loads(x) for x in (FIXTURES / "offload" / case["trace"]).read_text().splitlines() if x.strip()]
    reqs = [(float(d["arrival"]), Request(d["id"], d["tokens"], int(d["output_tokens"]), uid=i,
                                          arrival_time=float(d["arrival"]), hasher=hasher))
            for i, d in enumerate(rows)]
    reqs.sort(key=lambda x: x[0])
    drive(sched, reqs, case["engine"]["step_time"], StepDelayWorker(case["offload"]["transfer_delay_steps"]))
    return events, sched


def as_dict(ev: KVCacheEvent) -> dict[str, Any]:
    d = event_to_dict(ev)
    if "token_ids" in d:
        d["token_ids"] = list(d["token_ids"])
    return d


def canonical(batch: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Runs of consecutive CPU BlockStored sorted by hash (see the module docstring)."""
    out: list[dict[str, Any]] = []
    for cpu_store, run in groupby(batch, key=lambda d: d["type"] == "BlockStored" and d["medium"] == MEDIUM_CPU):
        items = list(run)
        out.extend(sorted(items, key=lambda d: d["block_hashes"]) if cpu_store else items)
    return out


def vllm_batches(name: str, self_describing: bool) -> list[tuple[int, list[dict[str, Any]]]]:
    path = EVENTS / f"{name}{'.sd' if self_describing else ''}.events.jsonl"
    out = []
    for line in path.read_text().splitlines():
        b = json.loads(line)
        evs = []
        for d in b["events"]:
            for k, v in ABSENT.items():
                assert d.pop(k, None) == v, (k, d)
            evs.append(d)
        out.append((b["schedules"], evs))
    return out


@pytest.mark.parametrize("self_describing", [False, True], ids=["placeholder", "self_describing"])
@pytest.mark.parametrize("name", CASES)
def test_events_equal_vllm(name: str, self_describing: bool) -> None:
    events, sched = run_case(name, self_describing)
    expected = vllm_batches(name, self_describing)
    assert any(d["medium"] == MEDIUM_CPU for _, b in expected for d in b), "the case has CPU-tier events"
    if sched.config.async_scheduling:
        ours = [as_dict(e) for _, e in events]
        assert canonical(ours) == canonical([d for _, b in expected for d in b])
        return
    got = [(step + 1, canonical([as_dict(e) for _, e in group])) for step, group in groupby(events, key=lambda t: t[0])]
    assert got == [(n, canonical(b)) for n, b in expected]


def tiny(*, blocks_per_chunk: int = 1, cpu: int = 3, self_describing: bool = False,
         sink: bool = True) -> tuple[Scheduler, list[tuple[int, KVCacheEvent]]]:
    e = dict(max_num_batched_tokens=256, max_num_seqs=8, max_model_len=4096, enable_chunked_prefill=True,
             long_prefill_token_threshold=0, policy="fcfs", watermark=0.0, async_scheduling=False,
             block_size=16, num_gpu_blocks=8)
    o = dict(num_cpu_chunks=cpu, blocks_per_chunk=blocks_per_chunk, policy="lru", offload_prompt_only=True,
             store_threshold=0)
    sched, events = engine({"engine": e, "offload": o}, self_describing=self_describing)
    if not sink:
        sched.kv_cache_manager.block_pool.event_sink = None
    return sched, events


def drive_tiny(sched: Scheduler, prompts: list[list[int]]) -> None:
    assert sched.hasher is not None
    reqs = [(0.5 * i, Request(f"r{i}", p, 1, uid=i, hasher=sched.hasher)) for i, p in enumerate(prompts)]
    drive(sched, reqs, 0.01, StepDelayWorker(1))


def test_store_completion_emits_one_placeholder_per_chunk_keyed_by_its_last_block() -> None:
    # 2-block chunks: a 64-token prompt is 2 chunks; vLLM's placeholder carries the offload key (the
    # hash of the chunk's last GPU block) alone, block_size 0, no tokens, in the next step's output
    sched, events = tiny(blocks_per_chunk=2)
    drive_tiny(sched, [list(range(64))])
    h = [external_block_hash(x) for x in sched.hasher.hash_token_blocks(list(range(64)))]  # type: ignore[union-attr]
    cpu = [(s, e) for s, e in events if isinstance(e, BlockStored | BlockRemoved) and e.medium == MEDIUM_CPU]
    assert [(s, type(e).__name__, e.block_hashes, e.block_size, list(e.token_ids), e.parent_block_hash)  # type: ignore[union-attr]
            for s, e in cpu] == [(1, "BlockStored", [h[1]], 0, [], None), (1, "BlockStored", [h[3]], 0, [], None)]


def test_self_describing_store_carries_the_chunk_blocks_parent_and_tokens() -> None:
    sched, events = tiny(blocks_per_chunk=2, self_describing=True)
    drive_tiny(sched, [list(range(64))])
    h = [external_block_hash(x) for x in sched.hasher.hash_token_blocks(list(range(64)))]  # type: ignore[union-attr]
    cpu = [e for _, e in events if isinstance(e, BlockStored | BlockRemoved) and e.medium == MEDIUM_CPU]
    assert all(isinstance(e, BlockStored) for e in cpu)
    assert [(e.block_hashes, e.parent_block_hash, list(e.token_ids), e.block_size, e.kv_cache_spec_kind)  # type: ignore[union-attr]
            for e in cpu] == [([h[0], h[1]], None, list(range(32)), 16, "full_attention"),
                               ([h[2], h[3]], h[1], list(range(32, 64)), 16, "full_attention")]


def test_eviction_is_one_removal_after_the_pools_events_of_its_step() -> None:
    # 3 CPU chunks; a (2 chunks), then b (2 chunks) evicts one of a's: one BlockRemoved(CPU) in the
    # step whose schedule() offered b's chunks, after that step's GPU BlockStored of b
    sched, events = tiny(cpu=3)
    drive_tiny(sched, [list(range(32)), list(range(100, 132))])
    removed = [(s, e) for s, e in events if isinstance(e, BlockRemoved) and e.medium == MEDIUM_CPU]
    assert len(removed) == 1 and len(removed[0][1].block_hashes) == 1
    step = removed[0][0]
    same_step = [e for s, e in events if s == step]
    assert [type(e).__name__ + "/" + str(getattr(e, "medium", None)) for e in same_step] == [
        "BlockStored/GPU", "BlockRemoved/CPU"]


def test_without_a_sink_the_tier_records_nothing() -> None:
    sched, events = tiny(sink=False)
    drive_tiny(sched, [list(range(32)), list(range(100, 132))])
    assert sched.tier is not None
    assert sched.tier.kv_events is None and sched.tier.connector.events_tracker is None
    assert sched.tier.connector.manager.events is None and events == []


def test_untiered_engine_events_have_no_cpu_medium() -> None:
    sched, events = tiny()
    sched2 = Scheduler(sched.config, CacheConfig(block_size=16, num_gpu_blocks=8), make_block_hasher("sha256", 16))
    evs: list[KVCacheEvent] = []
    sched2.kv_cache_manager.block_pool.event_sink = evs.append
    drive_tiny(sched2, [list(range(32)), list(range(100, 132))])
    assert evs and all(getattr(e, "medium", "GPU") == "GPU" for e in evs)

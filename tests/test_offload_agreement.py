"""Agreement of the CPU offload tier with vLLM 0.33.0's own Scheduler and OffloadingConnector.

Every case of ``tests/fixtures/vllm_oracle_033/offload/manifest.json`` was replayed by
``tools/vllm_oracle`` (``make_offload_fixtures.py``) through vLLM 0.33.0's ``Scheduler`` /
``AsyncScheduler`` with the ``OffloadingConnector`` over a ``CPUOffloadingManager`` and a stub worker
that reports each job ``transfer_delay_steps`` steps after the step that carried it (flushed jobs in
their step), finished requests committed in the order they finished. Here the same requests go
through apcsim's scheduler with ``sim.core.offload.step_worker.StepDelayWorker`` and
``sim.core.step_driver`` (the oracle's loop: fixed step time, two batches in flight with async), and
every request's GPU hit, CPU hit, preemptions, re-admission hits (GPU and CPU) and steps waiting for
KV must be equal, as must the summed GPU and connector prefix-cache stats, the prompt tokens by
source and the CPU tier's counters. vLLM is not needed to run this test.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import pytest
from offload_fixture_engine import fixture_scheduler

from sim.core.hashing import make_block_hasher
from sim.core.offload.step_worker import StepDelayWorker
from sim.core.request import Request
from sim.core.scheduler import Scheduler
from sim.core.step_driver import DriveResult, drive
from workloads.mooncake import load_mooncake

FIXTURES = Path(__file__).parent / "fixtures" / "vllm_oracle_033" / "offload"
MANIFEST: dict[str, Any] = json.loads((FIXTURES / "manifest.json").read_text())
STAT_FIELDS = ("requests", "queries", "hits", "preempted_requests", "preempted_queries", "preempted_hits")
ROW_FIELDS = ("hit_tokens", "num_preemptions", "readmit_hit_tokens", "external_hit_tokens",
              "readmit_external_hit_tokens", "steps_waiting_for_kv")


def load_requests(case: dict[str, Any], hasher: Any) -> list[tuple[float, Request]]:
    """The case's requests, in the oracle's order (by arrival, stable); uid = trace position."""
    if "trace" in case:
        rows = [json.loads(line) for line in (FIXTURES / case["trace"]).read_text().splitlines() if line.strip()]
        specs = [(float(d["arrival"]), d["id"], d["tokens"], int(d["output_tokens"]), d.get("output_token_ids"))
                 for d in rows]
    else:
        w = case["workload"]
        assert w["kind"] == "mooncake"
        specs = [(r.arrival, r.id, r.tokens, r.output_tokens, r.output_token_ids)
                 for r in load_mooncake(FIXTURES / w["path"], tokens_per_id=w["tokens_per_id"],
                                        time_scale=w["time_scale"])]
    reqs = [(t, Request(rid, toks, n, uid=i, arrival_time=t, output_token_ids=outs, hasher=hasher))
            for i, (t, rid, toks, n, outs) in enumerate(specs)]
    reqs.sort(key=lambda x: x[0])
    return reqs


def replay(case: dict[str, Any]) -> tuple[DriveResult, Scheduler]:
    e, o = case["engine"], case.get("offload")
    hasher = make_block_hasher("fast", e["block_size"])
    sched = fixture_scheduler(case, hasher)
    worker = StepDelayWorker(o["transfer_delay_steps"] if o is not None else 1)
    return drive(sched, load_requests(case, hasher), e["step_time"], worker), sched


def rows_of(res: DriveResult) -> dict[str, tuple[str, ...]]:
    out: dict[str, tuple[str, ...]] = {}
    for rid, o in res.requests.items():
        out[rid] = (str(o.hit_tokens), str(o.num_preemptions), ";".join(str(g) for g, _ in o.readmit_hits),
                    str(o.external_hit_tokens), ";".join(str(c) for _, c in o.readmit_hits),
                    str(o.steps_waiting_for_kv))
    return out


@pytest.mark.parametrize("name", list(MANIFEST["cases"]))
def test_offload_matches_vllm(name: str) -> None:
    case = MANIFEST["cases"][name]
    res, sched = replay(case)
    with open(FIXTURES / case["expected_csv"], newline="") as f:
        expected = {r["id"]: tuple(r[k] for k in ROW_FIELDS) for r in csv.DictReader(f)}
    got = rows_of(res)
    assert set(got) == set(expected)
    bad = {rid: {"vllm": expected[rid], "apcsim": got[rid]} for rid in expected if got[rid] != expected[rid]}
    assert not bad, f"{len(bad)} requests differ {ROW_FIELDS}: {dict(list(bad.items())[:5])}"
    stats = json.loads((FIXTURES / case["expected_stats"]).read_text())
    assert {k: getattr(res.prefix_cache, k) for k in STAT_FIELDS} == {k: stats[k] for k in STAT_FIELDS}
    assert res.total_preemptions == stats["total_preemptions"]
    tier = sched.tier
    if tier is None:
        return
    ext = tier.external_prefix_cache_stats
    assert {k: getattr(ext, k) for k in STAT_FIELDS} == {k: stats["connector_prefix_cache"][k] for k in STAT_FIELDS}
    assert {
        "local_cache_hit": tier.prompt_tokens_local_hit,
        "external_kv_transfer": tier.prompt_tokens_external,
        "local_compute": tier.prompt_tokens_computed,
    } == stats["prompt_tokens_by_source"]
    cs, ms, cpu = tier.connector.stats, tier.connector.manager.stats, stats["cpu_tier"]
    assert {
        "allocation_failures": cs.allocation_failures, "load_jobs": cs.load_jobs, "store_jobs": cs.store_jobs,
        "loaded_chunks": ms.chunks_loaded, "stored_chunks": ms.chunks_stored, "evicted_chunks": ms.chunks_evicted,
        "lookups_deferred": cs.deferred_lookups,
    } == {k: cpu[k] for k in ("allocation_failures", "load_jobs", "store_jobs", "loaded_chunks", "stored_chunks",
                              "evicted_chunks", "lookups_deferred")}

"""A disaggregated fleet's results: one request row from its two legs, and the P/D block of the
summary (mirrors nothing in vLLM: the proxy sees the two responses; this is the user's view).

Per request (``requests``), the decode leg's row (``replica`` = the decode replica, TPOT, output
tokens) with:

* ``arrival`` the user's arrival, so ``ttft`` / ``e2e`` include the prefill's queue, the prefill,
  the wait for decode blocks, the transfer and the decode's admission; ``first_scheduled`` (and
  ``queue_time``) the prefill leg's: when the prompt started computing;
* ``hit_tokens`` the prefill leg's (the prompt tokens not computed: the prefix cache hit), and with
  a shared store its ``external_hit_tokens`` / ``remote_hit_tokens`` and ``kv_wait_steps``;
  ``decode_hit_tokens`` what the decode replica's lookup found after the landing;
* ``prefill_replica`` (-1: served by the decode replica alone), ``decode_replica``,
  ``prefill_finish``, ``kv_wait_s`` (prefill finish to the read's start: waiting for decode blocks),
  ``transfer_s`` (the read's start to its landing: the link's queue and the bytes),
  ``transfer_bytes`` and ``kv_arrival`` (the landing, the decode leg's own arrival).

A request refused at the prefill's intake keeps its one row. ``summary`` is the single engine's over
these rows and every step; its prefix-cache counters are the prefill pool's (the decode pool's
lookups find the KV that was just sent). ``cluster.replicas`` keeps one row per replica over the
legs it served, with its ``role``; ``cluster.disaggregation`` splits the load (requests, prompt
tokens computed, output tokens, busy time, compute time -- busy without the empty steps spent
waiting for a read -- steps) by pool and sums the transfers (count, bytes,
seconds, wait for blocks: mean and p90). Imports neither simpy nor torch.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import pandas as pd

from sim.cluster.cluster_summary import cluster_block
from sim.core.prefix_cache_stats import PrefixCacheStats
from sim.replay.metrics import as_frame, finalize_requests, summarize

if TYPE_CHECKING:  # pragma: no cover
    from sim.cluster.cluster import ClusterResult


class Leg(Protocol):
    """A request's P/D record (``sim.cluster.disagg.Leg``): what the table takes from it."""

    @property
    def prefill(self) -> int: ...
    @property
    def prefill_finish(self) -> float: ...
    @property
    def transfer_start(self) -> float: ...
    @property
    def landed(self) -> float: ...
    @property
    def transfer_bytes(self) -> int: ...

_PREFILL_TIER = ("external_hit_tokens", "remote_hit_tokens", "kv_wait_steps")
"""A shared store's request columns (``sim.cluster.kv_store_summary``) a moved request takes from its
prefill leg: its prompt's load from the store, and the steps it waited for it."""
_LEG_COLUMNS = ("prefill_replica", "decode_replica", "decode_hit_tokens", "prefill_finish", "kv_wait_s",
                "transfer_s", "transfer_bytes", "kv_arrival")


def _p(x: pd.Series, q: float) -> float:
    v = x.dropna()
    return float(np.percentile(v, q)) if len(v) else math.nan


def merge_legs(res: ClusterResult, legs: Mapping[str, Leg], where: Mapping[str, int],
               trace: Mapping[str, tuple[int, float]], *, prefill_ids: range, router_info: dict[str, Any],
               ttft_slo_s: float, kv: dict[str, int], stats: Sequence[PrefixCacheStats], sim_time_s: float,
               num_evictions: int) -> ClusterResult:
    """Changes ``res``: its request table becomes one row per request, its summary the fleet's."""
    rq = res.requests
    ids = rq["request_id"]
    final = (rq["replica"] == ids.map(where)).to_numpy()
    out = rq[final].reset_index(drop=True)
    first = rq[~final].set_index("request_id")  # the prefill legs of requests that went on to decode
    oid = out["request_id"]
    moved = oid.isin(first.index).to_numpy()
    leg = [legs[x] for x in oid]
    out["decode_hit_tokens"] = out["hit_tokens"]
    out["kv_arrival"] = out["arrival"]
    out["arrival"] = oid.map(lambda x: trace[x][1]).astype("float64")
    if moved.any():
        out.loc[moved, "hit_tokens"] = oid[moved].map(first["hit_tokens"]).to_numpy()
        out.loc[moved, "first_scheduled"] = oid[moved].map(first["first_scheduled"]).to_numpy()
        for c in (c for c in out.columns if c.startswith("miss_") or c in _PREFILL_TIER):  # where the hit happens
            out.loc[moved, c] = oid[moved].map(first[c]).to_numpy()
    out["prefill_replica"] = np.array([g.prefill for g in leg], dtype=np.int64)
    on_decode = out["replica"].to_numpy() >= prefill_ids.stop
    out["decode_replica"] = np.where(on_decode, out["replica"].to_numpy(), -1).astype(np.int64)
    out["prefill_finish"] = np.array([g.prefill_finish for g in leg], dtype=np.float64)
    start = np.array([g.transfer_start for g in leg], dtype=np.float64)
    out["kv_wait_s"] = start - out["prefill_finish"].to_numpy()
    out["transfer_s"] = np.array([g.landed for g in leg], dtype=np.float64) - start
    out["transfer_bytes"] = np.array([g.transfer_bytes for g in leg], dtype=np.int64)
    out = as_frame(finalize_requests(out))
    res.request_table = out
    pool = PrefixCacheStats()
    for i in prefill_ids:
        pool.add(stats[i])
    base = [c for c in out.columns if c not in ("replica", "reroutes", "believed_hit_tokens", *_LEG_COLUMNS)]
    summary = summarize(out[base], res.steps, pool, sim_time_s=sim_time_s, num_evictions=num_evictions)
    for k, v in res.summary.items():  # the run-level keys the fleet's summary added (vllm_version, ...)
        summary.setdefault(k, v)
    rows = res.summary["cluster"]["replicas"]  # per replica, over the legs it served
    span = float(out["finish"].max() - out["arrival"].min()) if len(out) else 0.0
    block = cluster_block(out, res.steps, stats, router=router_info, ttft_slo_s=ttft_slo_s, span_s=span,
                          faults=(), kv_events=kv)
    for row in rows:
        row["role"] = "prefill" if row["replica"] in prefill_ids else "decode"
    block["replicas"] = rows
    busy = [r["busy_s"] for r in rows if r["role"] == "prefill"], [r["busy_s"] for r in rows if r["role"] == "decode"]
    block["load_imbalance_busy"] = max(_imbalance(busy[0]), _imbalance(busy[1]))
    block["disaggregation"] = pd_block(out, rows, res.steps)
    summary["cluster"] = block
    res.summary = summary
    return res


def _imbalance(values: list[float]) -> float:
    mean = float(np.mean(values)) if values else 0.0
    return max(values) / mean if mean > 0 else math.nan


def pd_block(requests: pd.DataFrame, rows: Sequence[Mapping[str, Any]], steps: pd.DataFrame) -> dict[str, Any]:
    """``cluster.disaggregation``: load by pool and the transfers (see the module docstring).
    ``compute_s`` sums the steps that scheduled tokens; ``busy_s`` also counts the empty steps an
    engine spent waiting for a read to land (``sim.cluster.disagg_hold``)."""
    worked: dict[Any, float] = (steps[steps["scheduled_tokens"] > 0].groupby("replica")["duration"].sum().to_dict()
                                if len(steps) else {})
    sides: dict[str, Any] = {}
    for role in ("prefill", "decode"):
        mine = [r for r in rows if r["role"] == role]
        sides[role] = {
            "replicas": len(mine),
            "requests": int(sum(r["num_requests"] for r in mine)),
            "prompt_tokens": int(sum(r["prompt_tokens"] for r in mine)),
            "busy_s": float(sum(r["busy_s"] for r in mine)),
            "compute_s": float(sum(float(worked.get(r["replica"], 0.0)) for r in mine)),
            "num_steps": int(sum(r["num_steps"] for r in mine)),
            "load_imbalance_busy": _imbalance([r["busy_s"] for r in mine]),
        }
    served = requests[requests["status"].astype(str) != "rejected"] if "status" in requests else requests
    moved = served[(served["decode_replica"] >= 0) & (served["prefill_replica"] >= 0)]
    sides["prefill"]["computed_tokens"] = int((moved["prompt_tokens"] - moved["hit_tokens"]).sum())
    sides["decode"]["output_tokens"] = int(served["output_tokens"].sum())
    sides["decode"]["recomputed_prompt_tokens"] = int((moved["prompt_tokens"] - moved["decode_hit_tokens"]).sum())
    sides["decode"]["decode_only_requests"] = int((served["prefill_replica"] < 0).sum())
    sides["transfers"] = {
        "count": len(moved),
        "bytes": int(moved["transfer_bytes"].sum()),
        "seconds": float(moved["transfer_s"].sum()),
        "transfer_s_mean": float(moved["transfer_s"].mean()) if len(moved) else math.nan,
        "transfer_s_p90": _p(moved["transfer_s"], 90),
        "kv_wait_s_mean": float(moved["kv_wait_s"].mean()) if len(moved) else math.nan,
        "kv_wait_s_p90": _p(moved["kv_wait_s"], 90),
    }
    return sides

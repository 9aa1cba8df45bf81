"""The fleet's result tables and ``cluster`` block from the replicas' Tables, without pandas (mirrors
nothing in vLLM: the simulator's own output).

A single engine hands its results over as :class:`~sim.replay.table.Table` columns and summarises
them with numpy (``sim.replay.metrics``), so a run that only summarises never imports pandas --
whose import alone costs about 0.3 s of CPU, a third of a 2,000-request replay. The fleet's result
assembly (``sim.cluster.cluster.ClusterReplay._result``) built DataFrames instead: one per replica,
then their concatenation, a ``replica`` column assigned (a copy), the rows reordered (another
copy): for 16 replicas on 2,000 Mooncake requests, 613,645 step rows copied four times, 180 MiB
of page faults above the 363 MiB the replay itself holds.

:func:`table_result` does the same in the common case, column by column:

* each replica's request and step Tables and its summary (``summarize`` reads Tables), one
  computation shared by the replicas that recorded nothing and end at the same time;
* the fleet's tables: each column the concatenation of the replicas' (in replica order), then the
  ``replica``, ``reroutes`` and ``believed_hit_tokens`` columns, the requests in stream order
  (a stable argsort of their stream index, as the pandas path); the step columns are joined from
  the replicas' recorded chunks in one copy (``sim.replay.column_table.numeric_joiners``), each
  replica's step Table a view of its rows -- lazily (``sim.replay.table.LazyTable``): a column is
  joined when first read, and the summaries read two of the 16 (``batch_size``, ``duration``), so
  a run that only summarises copies 9.8 of the 79 MiB of 613,645 step rows (page faults: -6.9k
  of the Dynamo ratio child's 72.9k);
* the ``cluster`` block: :func:`cluster_block` -- the figures of
  ``sim.cluster.cluster_summary.cluster_block`` from the same columns, with the same numpy
  reductions in the same order (pandas' ``Series.sum`` of float64 is numpy's pairwise sum with NaN
  as 0; ``Series.mean`` of bools the count over the length), so every figure is the same float.

It declines (None: the pandas path runs, and stays this one's oracle in
``tests/test_fleet_tables.py``) whenever something outside that case is in play: miss attribution,
a KV store, a CPU tier, a fault or a re-route, a rejected request, a replica whose request table
is a DataFrame (``finalize_requests``' corner case), replica 0 idle (the pandas path
concatenates its empty frames, of ``object`` columns, too), or a column whose parts pandas would type
differently when concatenated (an int64 part beside a float64 one, strings beside ``None`` only).

Invariants: the DataFrames of the tables returned (``as_frame``) equal the pandas path's, dtypes
and index included, and the summaries are equal to the bit (tested). Imports neither pandas,
simpy nor torch.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar

import numpy as np

from sim.core.prefix_cache_stats import PrefixCacheStats
from sim.replay.column_table import numeric_joiners
from sim.replay.engine import ReplayResult
from sim.replay.metrics import Frame, nan_percentile, summarize
from sim.replay.table import Column, LazyTable, Table

R = TypeVar("R", bound=ReplayResult)


@dataclass
class ReplicaTables:
    """One replica's request and step tables and its summary (Tables; the request table a
    DataFrame in ``finalize_requests``' corner case, e.g. a replica that recorded nothing)."""

    requests: Frame
    steps: Frame
    summary: dict[str, Any]


def replica_tables(rec: Any, end_time: float, evictions: int,
                   idle: dict[tuple[float, int], ReplicaTables]) -> ReplicaTables:
    """Replica ``rec``'s (a ``ReplayRecorder``) tables and summary, fresh ones each call; a replica
    that recorded nothing shares one computation per end time and eviction count (``idle``: the
    cache; a DataFrame from it is copied)."""
    empty = rec.is_empty
    key = (end_time, evictions)
    if not empty or key not in idle:
        rq, st = rec.tables()
        s = summarize(rq, st, rec.stats, sim_time_s=end_time, num_evictions=evictions)
        if not empty:
            return ReplicaTables(rq, st, s)
        idle[key] = ReplicaTables(rq, st, s)
    hit = idle[key]
    rq, st = (t if isinstance(t, Table) else t.copy() for t in (hit.requests, hit.steps))  # (Tables never change)
    return ReplicaTables(rq, st, copy.deepcopy(hit.summary))


def _rows(table: Table, name: str, at: int, n: int) -> Column:
    """Rows ``at`` to ``at + n`` of ``table``'s column ``name`` (a view of a numpy column)."""
    return table[name][at:at + n]


def _kind(col: Column) -> tuple[Any, ...]:
    """What pandas types a column part as: its numpy dtype, or the set of its values' types."""
    if isinstance(col, np.ndarray):
        return ("array", col.dtype.str)
    return ("list", frozenset(map(type, col)))


def concat_tables(parts: Sequence[Table]) -> Table | None:
    """The rows of ``parts`` (non-empty Tables with the same columns) one after the other, or None
    when a column's parts are of different kinds (pandas would type their concatenation itself)."""
    names = parts[0].columns
    cols: dict[str, Column] = {}
    for name in names:
        pieces = [p[name] for p in parts]
        kinds = {_kind(c) for c in pieces}
        if len(kinds) != 1:
            return None
        if isinstance(pieces[0], np.ndarray):
            cols[name] = np.concatenate(pieces) if len(pieces) > 1 else pieces[0]
        else:
            cols[name] = [v for c in pieces for v in c]
    return Table(cols)


def take(table: Table, order: np.ndarray) -> Table:
    """The rows of ``table`` in ``order`` (positions)."""
    cols: dict[str, Column] = {}
    for name in table.columns:
        col = table[name]
        cols[name] = col[order] if isinstance(col, np.ndarray) else [col[i] for i in order.tolist()]
    return Table(cols)


def _sum(x: np.ndarray) -> Any:
    """pandas' ``Series.sum()``: NaN counted as 0 in a float column."""
    if x.dtype.kind == "f":
        nan = np.isnan(x)
        if nan.any():
            x = np.where(nan, 0.0, x)
        return x.sum(dtype=np.float64)
    return x.sum()


def ratio_or_nan(a: float, b: float) -> float:
    return a / b if b else math.nan


def _imbalance(values: list[float]) -> float:
    mean = float(np.mean(values)) if values else 0.0
    return max(values) / mean if mean > 0 else math.nan


def replica_rows(per: Sequence[ReplicaTables], stats: Sequence[PrefixCacheStats]) -> list[dict[str, Any]]:
    """``cluster_summary.replica_rows`` from each replica's own tables (no rejected request: the
    caller's case). The figures are order-free sums, counts and percentiles, and a replica's steps
    are its own rows in order, as the combined table holds them."""
    rows = []
    for i, (t, st) in enumerate(zip(per, stats, strict=True)):
        token_hit_rate = ratio_or_nan(st.hits, st.queries) if st.queries else 0.0
        rq, sp = t.requests, t.steps
        if not len(rq) and not len(sp):
            rows.append(replica_row(i, token_hit_rate))
            continue
        n = len(rq)
        prompt = int(_sum(np.asarray(rq["prompt_tokens"]))) if n else 0
        hits = float(_sum(np.asarray(rq["hit_tokens"]))) if n else 0.0
        ttft = np.asarray(rq["ttft"], dtype=np.float64) if n else np.zeros(0)
        rows.append(replica_row(
            i, token_hit_rate, num_requests=n, prompt_tokens=prompt, hit_tokens=hits,
            busy_s=float(_sum(np.asarray(sp["duration"], dtype=np.float64))) if len(sp) else 0.0,
            num_steps=len(sp), ttft_p50_s=nan_percentile(ttft, 50), ttft_p99_s=nan_percentile(ttft, 99)))
    return rows


def replica_row(replica: int, token_hit_rate: float, *, num_requests: int = 0, num_rejected: int = 0,
                prompt_tokens: int = 0, hit_tokens: float = 0.0, busy_s: float = 0.0, num_steps: int = 0,
                ttft_p50_s: float = math.nan, ttft_p99_s: float = math.nan) -> dict[str, Any]:
    """One replica's row of the ``cluster`` block, in ``summary.json``'s key order, from figures
    either table layer computed (the defaults: a replica with no request and no step)."""
    return {
        "replica": replica,
        "num_requests": num_requests,
        "num_rejected_requests": num_rejected,
        "prompt_tokens": prompt_tokens,
        "token_hit_rate": token_hit_rate,
        "request_hit_rate": ratio_or_nan(hit_tokens, prompt_tokens) if prompt_tokens else 0.0,
        "busy_s": busy_s,
        "num_steps": num_steps,
        "ttft_p50_s": ttft_p50_s,
        "ttft_p99_s": ttft_p99_s,
    }


def belief_summary(requests: Table) -> dict[str, Any]:
    """``cluster_summary.belief_summary`` of the fleet's request Table."""
    believed_all = np.asarray(requests["believed_hit_tokens"], dtype=np.float64)
    keep = ~np.isnan(believed_all)
    if not keep.any():
        return {}
    believed = believed_all[keep]
    actual = np.asarray(requests["hit_tokens"])[keep].astype(np.float64)
    fp = np.clip(believed - actual, 0.0, None)
    fn = np.clip(actual - believed, 0.0, None)
    b, a, p, n = (float(_sum(x)) for x in (believed, actual, fp, fn))
    return belief_block(int(keep.sum()), b, a, p, n, float((fp > 0).mean()), float((fn > 0).mean()))


def belief_block(requests: int, believed: float, actual: float, false_positive: float, false_negative: float,
                 overestimated: float, underestimated: float) -> dict[str, Any]:
    """The ``belief`` block, in ``summary.json``'s key order, from sums either table layer computed."""
    return {
        "requests": requests,
        "believed_hit_tokens": believed,
        "actual_hit_tokens": actual,
        "false_positive_tokens": false_positive,
        "false_negative_tokens": false_negative,
        "false_positive_rate": ratio_or_nan(false_positive, believed),
        "false_negative_rate": ratio_or_nan(false_negative, actual),
        "overestimated_requests": overestimated,
        "underestimated_requests": underestimated,
    }


def cluster_head(*, num_replicas: int, router: dict[str, Any], rows: list[dict[str, Any]], ttft_slo_s: float,
                 goodput_fraction: float, goodput_count: float, span_s: float, num_reroutes: int,
                 kv_events: dict[str, int]) -> dict[str, Any]:
    """The ``cluster`` block's leading fields, in ``summary.json``'s key order, from figures either
    table layer computed (this module's numpy columns or ``cluster_summary``'s pandas frames)."""
    return {
        "num_replicas": num_replicas,
        "router": router,
        "replicas": rows,
        "load_imbalance_busy": _imbalance([r["busy_s"] for r in rows]),
        "load_imbalance_prompt_tokens": _imbalance([float(r["prompt_tokens"]) for r in rows]),
        "ttft_slo_s": ttft_slo_s,
        "goodput_fraction": goodput_fraction,
        "goodput_requests_per_s": ratio_or_nan(goodput_count, span_s),
        "num_reroutes": num_reroutes,
        "kv_events": kv_events,
    }


def cluster_block(requests: Table, per: Sequence[ReplicaTables], stats: Sequence[PrefixCacheStats], *,
                  router: dict[str, Any], ttft_slo_s: float, span_s: float,
                  kv_events: dict[str, int]) -> dict[str, Any]:
    """``cluster_summary.cluster_block`` without faults, re-routes or rejected requests."""
    rows = replica_rows(per, stats)
    ttft = np.asarray(requests["ttft"], dtype=np.float64)
    met = ttft <= ttft_slo_s  # (NaN: not met, as pandas compares)
    out = cluster_head(num_replicas=len(stats), router=router, rows=rows, ttft_slo_s=ttft_slo_s,
                       goodput_fraction=float(met.mean()) if len(requests) else math.nan,
                       goodput_count=float(met.sum()), span_s=span_s, num_reroutes=0, kv_events=kv_events)
    belief = belief_summary(requests)
    if belief:
        out["belief"] = belief
    return out


@dataclass
class FleetTables:
    """What :func:`fleet_tables` hands :func:`table_result`: the fleet's request and step tables and
    the span from the first arrival to the last finish (the ``cluster`` block's goodput rate)."""

    requests: Table
    steps: Table
    span_s: float


def fleet_tables(per: list[ReplicaTables], steps: Table, believed: dict[str, int | None],
                 trace: dict[str, tuple[int, float]]) -> FleetTables | None:
    """The fleet's request table (stream order, with ``replica``, ``reroutes`` and
    ``believed_hit_tokens``) and step table (``steps``: the replicas' step rows in replica order,
    given, with ``replica`` added), or None outside the module docstring's case (rejected requests,
    parts of different kinds, no request at all)."""
    used = [(i, t.requests) for i, t in enumerate(per) if len(t.requests)]
    stepped = [(i, t.steps) for i, t in enumerate(per) if len(t.steps)]
    if not used or not stepped or used[0][0] or stepped[0][0]:
        return None  # (the pandas path concatenates replica 0's empty frame too: its object dtypes)
    if not all(isinstance(t, Table) for _, t in used):
        return None
    if any(s == "rejected" for _, t in used for s in (t["status"] if "status" in t else ())):
        return None
    requests = concat_tables([t for _, t in used])  # type: ignore[misc]  # (Tables: checked above)
    if requests is None:
        return None
    ids = requests["request_id"]
    n = len(requests)
    beliefs = [believed.get(x) for x in ids]
    requests = requests.with_columns(
        replica=np.repeat(np.array([i for i, _ in used], dtype=np.int64), [len(t) for _, t in used]),
        reroutes=np.zeros(n, dtype=np.int64),
        believed_hit_tokens=np.array([math.nan if b is None else b for b in beliefs], dtype=np.float64),
    )
    order = np.array([trace[x][0] for x in ids], dtype=np.int64).argsort(kind="stable")
    requests = take(requests, order)
    replica = partial(np.repeat, np.array([i for i, _ in stepped], dtype=np.int64), [len(t) for _, t in stepped])
    steps = steps.with_lazy_columns(replica=replica) if isinstance(steps, LazyTable) else steps.with_columns(
        replica=replica())
    finish = np.asarray(requests["finish"], dtype=np.float64)
    arrival = np.asarray(requests["arrival"], dtype=np.float64)
    span = float(np.nanmax(finish) - np.nanmin(arrival))
    return FleetTables(requests, steps, span)


def table_result(replay: Any, wall: float, result_type: Callable[..., R]) -> R | None:
    """``replay``'s (a ``sim.cluster.cluster.ClusterReplay`` whose clock has stopped) result as
    ``result_type`` (``ClusterResult``) from Tables, or None outside the module docstring's case."""
    reps = replay.replicas
    if (replay.attributions is not None or replay.kv_store is not None or replay._fault_log or replay._reroutes
            or any(r.tier_parts for r in reps)):
        return None
    stepped = [r.rec.step_columns for r in reps if len(r.rec.step_columns)]
    joiners = numeric_joiners(stepped) if stepped else None
    if joiners is None:
        return None
    steps = LazyTable(sum(map(len, stepped)), dict(zip(stepped[0].columns, joiners, strict=True)))
    per, at = [], 0  # a replica's step Table: its rows of the fleet's (views, not copies), made when read
    for r in reps:
        n = len(r.rec.step_columns)
        if not n:
            per.append(replica_tables(r.rec, r.end_time, r.total_evictions, replay._idle_tables))
            continue
        rq, st = r.rec.request_table(), LazyTable(n, {name: partial(_rows, steps, name, at, n) for name in steps})
        per.append(ReplicaTables(rq, st, summarize(rq, st, r.rec.stats, sim_time_s=r.end_time,
                                                   num_evictions=r.total_evictions)))
        at += n
    fleet = fleet_tables(per, steps, replay._believed, replay._trace)
    if fleet is None:
        return None
    stats = PrefixCacheStats()
    for r in reps:
        stats.add(r.rec.stats)
    summary = summarize(fleet.requests, fleet.steps, stats, sim_time_s=max(r.end_time for r in reps),
                        num_evictions=sum(r.total_evictions for r in reps))
    pipeline = replay.pipeline
    kv = {"batches": pipeline.num_batches, "events": pipeline.num_events} if pipeline is not None else {}
    summary["cluster"] = cluster_block(fleet.requests, per, [r.rec.stats for r in reps], router=replay.router_info,
                                       ttft_slo_s=replay.ttft_slo_s, span_s=fleet.span_s, kv_events=kv)
    recorded = pipeline.recorded if pipeline is not None and pipeline.recorded else []
    replicas = [ReplayResult(t.requests, t.steps, r.rec.stats, t.summary, wall) for r, t in zip(reps, per, strict=True)]
    return result_type(fleet.requests, fleet.steps, stats, summary, wall, events=[(s, e) for _, s, e in recorded],
                       replicas=replicas, event_replicas=[r for r, _, _ in recorded])

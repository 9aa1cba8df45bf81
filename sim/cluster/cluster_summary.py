"""The cluster summary: per-replica figures, load imbalance, goodput, router belief against engine
truth, and the dip and recovery around each fault (mirrors nothing in vLLM: fleet-level metrics).

From the combined request table (one row per request, ``replica`` = where it finished; columns of
``sim.replay.metrics`` plus ``believed_hit_tokens`` and ``reroutes``) and step table:

* per replica: requests, prompt tokens served, ``token_hit_rate`` (vLLM's, from its own stats),
  ``request_hit_rate``, busy time (sum of step durations), TTFT p50 / p99;
* ``load_imbalance_busy`` and ``load_imbalance_prompt_tokens``: max over mean across replicas of
  busy time and of prompt tokens served (1.0 is perfect balance);
* ``goodput_*``: served requests whose TTFT met ``ttft_slo_s`` (fraction of the served, and per
  second of the run);
* ``belief``: over requests with a believed hit, the believed and actual hit tokens summed,
  ``false_positive_rate`` = sum(max(believed - actual, 0)) / sum(believed) (residency the router
  believed in and the engine did not have) and ``false_negative_rate`` = sum(max(actual -
  believed, 0)) / sum(actual), and the share of requests over- and under-estimated;
* ``faults``: per fault, requests re-routed, then hit rate and TTFT p50 of requests arriving in
  the ``window_s`` before the fault, while it is down and in the ``window_s`` after it is back, and
  ``recovery_s``: time from ``up_at`` until the TTFT p50 over the next ``window_s`` of arrivals is
  back within 10 % of its pre-fault level (NaN if never).

One rule for rejected requests, the single engine's (``sim.replay.metrics``): they never ran, so
every figure -- the fleet's ``num_requests``, goodput, each replica's ``num_requests``, prompt
tokens, hit rates, TTFT -- is over the served requests, and they are only counted
(``num_rejected_requests``, in total and per replica, where the replica that refused them is
named): the replicas' ``num_requests`` add up to the fleet's, and so do their
``num_rejected_requests``.

Invariants: a pure function of the tables. Imports neither simpy nor torch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from sim.cluster.fleet_tables import belief_block, cluster_head, ratio_or_nan, replica_row
from sim.core.prefix_cache_stats import PrefixCacheStats


def _rejected(requests: pd.DataFrame) -> pd.Series:
    """Which rows were refused at intake (``status == "rejected"``; none without the column)."""
    if "status" not in requests.columns:
        return pd.Series(False, index=requests.index)
    return requests["status"].astype(str) == "rejected"


def _p(values: pd.Series, q: float) -> float:
    v = values.dropna()
    return float(np.percentile(v, q)) if len(v) else math.nan


def replica_rows(requests: pd.DataFrame, steps: pd.DataFrame,
                 stats: Sequence[PrefixCacheStats]) -> list[dict[str, Any]]:
    """One summary row per replica. Each replica's rows are found once (group positions, in table
    order: the rows a mask would select), so a fleet of many idle replicas costs its busy ones."""
    rows = []
    rejected = _rejected(requests).to_numpy()
    at_rq = requests.groupby("replica", sort=False).indices if len(requests) else {}
    at_sp = steps.groupby("replica", sort=False).indices if len(steps) else {}
    for i, st in enumerate(stats):
        token_hit_rate = ratio_or_nan(st.hits, st.queries) if st.queries else 0.0
        if i not in at_rq and i not in at_sp:  # no request, no step: the empty row
            rows.append(replica_row(i, token_hit_rate))
            continue
        pos = at_rq.get(i, np.zeros(0, dtype=np.intp))
        rq = requests.iloc[pos[~rejected[pos]]]
        sp = steps.iloc[at_sp.get(i, np.zeros(0, dtype=np.intp))]
        rows.append(replica_row(
            i, token_hit_rate, num_requests=len(rq), num_rejected=int(rejected[pos].sum()),
            prompt_tokens=int(rq["prompt_tokens"].sum()), hit_tokens=float(rq["hit_tokens"].sum()),
            busy_s=float(sp["duration"].sum()), num_steps=len(sp),
            ttft_p50_s=_p(rq["ttft"], 50), ttft_p99_s=_p(rq["ttft"], 99)))
    return rows


def belief_summary(requests: pd.DataFrame) -> dict[str, Any]:
    """Router belief against engine truth (see the module docstring); empty without beliefs."""
    if "believed_hit_tokens" not in requests or requests["believed_hit_tokens"].isna().all():
        return {}
    rq = requests.dropna(subset=["believed_hit_tokens"])
    believed = rq["believed_hit_tokens"].astype(float)
    actual = rq["hit_tokens"].astype(float)
    fp = (believed - actual).clip(lower=0)
    fn = (actual - believed).clip(lower=0)
    return belief_block(len(rq), float(believed.sum()), float(actual.sum()), float(fp.sum()), float(fn.sum()),
                        float((fp > 0).mean()), float((fn > 0).mean()))


def _window(requests: pd.DataFrame, lo: float, hi: float) -> dict[str, float]:
    rq = requests[(requests["arrival"] >= lo) & (requests["arrival"] < hi)]
    prompt = float(rq["prompt_tokens"].sum())
    return {"requests": len(rq), "request_hit_rate": ratio_or_nan(float(rq["hit_tokens"].sum()), prompt),
            "ttft_p50_s": _p(rq["ttft"], 50)}


def fault_summary(requests: pd.DataFrame, faults: Sequence[tuple[int, float, float | None, int]],
                  window_s: float = 60.0) -> list[dict[str, Any]]:
    """Dip and recovery around each fault ``(replica, down_at, up_at, rerouted)``."""
    out = []
    order = requests.sort_values("arrival")
    arr = order["arrival"].to_numpy()
    ttft = order["ttft"].to_numpy()
    end = float(arr[-1]) if len(arr) else 0.0
    for replica, down, up, rerouted in faults:
        before = _window(requests, down - window_s, down)
        during = _window(requests, down, up if up is not None else math.inf)
        rec: dict[str, Any] = {"replica": replica, "down_at": down, "up_at": up, "rerouted": rerouted,
                               "before": before, "during": during}
        recovery = math.nan
        if up is not None:
            rec["after"] = _window(requests, up, up + window_s)
            base = before["ttft_p50_s"]
            if not math.isnan(base):
                t = up
                while t <= end:
                    lo, hi = np.searchsorted(arr, [t, t + window_s])
                    if hi > lo and float(np.median(ttft[lo:hi])) <= 1.1 * base:
                        recovery = t - up
                        break
                    t += max(window_s / 30.0, 1.0)
        rec["recovery_s"] = recovery
        out.append(rec)
    return out


def cluster_block(requests: pd.DataFrame, steps: pd.DataFrame, stats: Sequence[PrefixCacheStats], *,
                  router: dict[str, Any], ttft_slo_s: float, span_s: float,
                  faults: Sequence[tuple[int, float, float | None, int]], kv_events: dict[str, int]) -> dict[str, Any]:
    """The ``cluster`` block of ``summary.json``."""
    rows = replica_rows(requests, steps, stats)
    served = requests[~_rejected(requests)]  # the one rule: rejected requests are counted, never averaged
    met = served["ttft"] <= ttft_slo_s
    out = cluster_head(num_replicas=len(stats), router=router, rows=rows, ttft_slo_s=ttft_slo_s,
                       goodput_fraction=float(met.mean()) if len(served) else math.nan,
                       goodput_count=float(met.sum()), span_s=span_s,
                       num_reroutes=int(requests["reroutes"].sum()) if len(requests) else 0, kv_events=kv_events)
    belief = belief_summary(requests)
    if belief:
        out["belief"] = belief
    if faults:
        out["faults"] = fault_summary(requests, faults)
    return out

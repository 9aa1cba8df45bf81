"""Per-request and per-step records of a replay, and the run summary.

Row tuples while replaying, turned into pandas tables at the end (pandas is imported only then).

Per request: ``arrival``, ``first_scheduled`` (start of the step that first admitted it),
``first_token`` (end of the step that sampled its first token), ``finish``, ``ttft``, ``tpot``
(``(finish - first_token) / (output_tokens - 1)``), ``e2e``, ``prompt_tokens``, ``output_tokens``,
``hit_tokens`` (computed tokens granted at first admission, vLLM's ``num_new_computed_tokens``),
``num_preemptions`` and ``readmit_hit_tokens`` (hits on each re-admission, ``;``-separated),
``status`` (``finished``, or ``rejected``: refused at intake, ``sim.replay.rejection``) and
``reject_reason`` (``prompt_too_long: ...`` / ``never_fits_pool: ...``, else empty).

Rejected requests never ran: every summary metric is over the other requests
(``num_requests`` counts those), and ``num_rejected_requests`` counts the rejected ones.

Summary hit rates (each a fraction; the names say what is counted):

* ``prefix_cache_hit_rate`` -- vLLM's metric (``PrefixCacheStats``): prefix-cache ``hits / queries``
  summed over every lookup of non-preempted requests (a request waiting at the head of the queue is
  looked up, and counted, again at every step; ``prompt_logprobs`` requests are not counted;
  resumed requests go to the ``preempted_*`` counters);
* ``first_admission_token_hit_rate`` -- ``hit_tokens`` granted at each request's first admission
  over all prompt tokens (each request counted once; what the offline bounds of
  ``workloads.bounds`` model, so compare those with this one);
* ``requests_with_hit_fraction`` -- the share of requests granted at least one hit token at first
  admission (``num_requests_with_hit / num_requests``).

Deprecated aliases, kept with identical values for one release (0.2 drops them):
``token_hit_rate`` = ``prefix_cache_hit_rate``, ``request_hit_rate`` =
``first_admission_token_hit_rate`` (token-weighted, not a share of requests).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

import numpy as np

from sim.core.prefix_cache_stats import PrefixCacheStats

if TYPE_CHECKING:  # pandas is imported only to build the tables (it costs a third of a second)
    import pandas as pd

REQUEST_COLUMNS = (
    "request_id",
    "arrival",
    "first_scheduled",
    "first_token",
    "finish",
    "prompt_tokens",
    "output_tokens",
    "hit_tokens",
    "num_preemptions",
    "readmit_hit_tokens",
    "salt",
    "lora",
    "tenant",
    "session",
    "prompt_logprobs",
    "status",
    "reject_reason",
)

STEP_COLUMNS = (
    "step",
    "start",
    "duration",
    "batch_size",
    "scheduled_tokens",
    "prefill_tokens",
    "decode_seqs",
    "admitted",
    "preempted",
    "finished",
    "running",
    "waiting",
    "free_blocks",
    "cached_blocks",
    "kv_usage",
)


class RecordTable:
    """Append-only rows (tuples), turned into columns at the end; ``data`` gives mutable columns
    of the rows appended so far (used to fill per-request fields as events happen)."""

    def __init__(self, columns: tuple[str, ...]) -> None:
        self.columns = columns
        self.rows: list[list[Any] | tuple[Any, ...]] = []

    def append(self, *values: Any) -> None:
        self.rows.append(values)

    def extend(self, *columns: Iterable[Any]) -> None:
        """Several rows given as columns, in ``columns`` order (a fast-forward window's steps)."""
        self.rows.extend(zip(*columns, strict=True))

    def append_mutable(self, *values: Any) -> list[Any]:
        row = list(values)
        self.rows.append(row)
        return row

    def __len__(self) -> int:
        return len(self.rows)

    def to_frame(self) -> pd.DataFrame:
        import pandas as pd

        return pd.DataFrame.from_records(self.rows, columns=list(self.columns))


def finalize_requests(df: pd.DataFrame) -> pd.DataFrame:
    """Add the derived latency columns (seconds)."""
    df = df.copy()
    df["ttft"] = df["first_token"] - df["arrival"]
    df["queue_time"] = df["first_scheduled"] - df["arrival"]
    df["e2e"] = df["finish"] - df["arrival"]
    denom = (df["output_tokens"] - 1).where(df["output_tokens"] > 1)
    df["tpot"] = (df["finish"] - df["first_token"]) / denom
    return df


def _pct(series: pd.Series, q: float) -> float:
    s = series.dropna()
    return float(np.percentile(s, q)) if len(s) else math.nan


def summarize(
    requests: pd.DataFrame,
    steps: pd.DataFrame,
    stats: PrefixCacheStats,
    *,
    sim_time_s: float,
    num_evictions: int,
) -> dict[str, Any]:
    """Headline metrics of a run (JSON-serialisable); rejected requests are only counted."""
    if "status" in requests:
        rejected = requests["status"] == "rejected"
        num_rejected = int(rejected.sum())
        if num_rejected:
            requests = requests[~rejected]
    else:
        num_rejected = 0
    n = len(requests)
    prompt = int(requests["prompt_tokens"].sum()) if n else 0
    outputs = int(requests["output_tokens"].sum()) if n else 0
    hit_first = int(requests["hit_tokens"].sum()) if n else 0
    with_hit = int((requests["hit_tokens"] > 0).sum()) if n else 0
    prefix_rate = (stats.hits / stats.queries) if stats.queries else 0.0
    first_rate = (hit_first / prompt) if prompt else 0.0
    span = (float(requests["finish"].max()) - float(requests["arrival"].min())) if n else 0.0
    out: dict[str, Any] = {
        "num_requests": n,
        "num_rejected_requests": num_rejected,
        "num_steps": len(steps),
        "prompt_tokens": prompt,
        "output_tokens": outputs,
        "prefix_cache_hit_rate": prefix_rate,
        "first_admission_token_hit_rate": first_rate,
        "requests_with_hit_fraction": with_hit / n if n else 0.0,
        "num_requests_with_hit": with_hit,
        "token_hit_rate": prefix_rate,  # deprecated alias of prefix_cache_hit_rate
        "request_hit_rate": first_rate,  # deprecated alias of first_admission_token_hit_rate
        "prefix_cache": asdict(stats),
        "num_preemptions": int(requests["num_preemptions"].sum()) if n else 0,
        "num_evictions": num_evictions,
        "sim_time_s": sim_time_s,
        "throughput_requests_per_s": n / span if span > 0 else math.nan,
        "throughput_output_tokens_per_s": outputs / span if span > 0 else math.nan,
        "throughput_total_tokens_per_s": (prompt + outputs) / span if span > 0 else math.nan,
        "mean_batch_size": float(steps["batch_size"].mean()) if len(steps) else 0.0,
    }
    for metric in ("ttft", "tpot", "e2e", "queue_time"):
        col = requests[metric] if n else None
        out[f"{metric}_mean_s"] = float(col.mean()) if col is not None else math.nan
        for q in (50, 90, 99):
            out[f"{metric}_p{q}_s"] = _pct(col, q) if col is not None else math.nan
    return out

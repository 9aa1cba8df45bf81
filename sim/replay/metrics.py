"""Per-request and per-step records of a replay, and the run summary.

Row tuples while replaying, turned into :class:`~sim.replay.table.Table` columns at the end;
``summarize`` reads a Table or a DataFrame alike, so a run that writes its results never imports
pandas (``sim.replay.table``).

Per request: ``arrival``, ``first_scheduled`` (start of the step that first admitted it),
``first_token`` (end of the step that sampled its first token), ``finish``, ``ttft``, ``tpot``
(``(finish - first_token) / (output_tokens - 1)``), ``e2e``, ``prompt_tokens``, ``output_tokens``,
``hit_tokens`` (computed tokens granted at first admission, vLLM's ``num_new_computed_tokens``),
``num_preemptions`` and ``readmit_hit_tokens`` (hits on each re-admission, ``;``-separated),
``status`` (``finished``, or ``rejected``: refused at intake, ``sim.replay.rejection``) and
``reject_reason`` (``prompt_too_long: ...`` / ``never_fits_pool: ...``, else empty) and
``finish_reason`` of a finished request: ``max_tokens`` (every requested output token was made) or
``length_capped`` (stopped at ``max_model_len`` first, vLLM's ``FINISHED_LENGTH_CAPPED``:
``output_tokens`` then counts the tokens made, fewer than the trace asked for); empty otherwise. The
summary counts the capped ones (``num_length_capped_requests``).

Rejected requests never ran: every summary metric is over the other requests
(``num_requests`` counts those), and ``num_rejected_requests`` counts the rejected ones.

Summary hit rates (each a fraction; the names say what is counted):

* ``prefix_cache_hit_rate`` -- vLLM's metric (``PrefixCacheStats``): prefix-cache ``hits / queries``
  of non-preempted requests, with the semantics of the run's ``vllm_version`` (the summary names
  it): 0.25.1 counts every lookup (a request waiting at the head of the queue is looked up, and
  counted, again at every step), 0.33.0 each admission once (queries = the prompt tokens of first
  admissions); ``prompt_logprobs`` requests are not counted; resumed requests go to the
  ``preempted_*`` counters;
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
from dataclasses import asdict
from typing import TYPE_CHECKING, Any, Union

import numpy as np

from sim.core.prefix_cache_stats import PrefixCacheStats
from sim.replay.table import Table

if TYPE_CHECKING:  # pandas is imported only when a DataFrame is asked for (it costs half a second)
    import pandas as pd

Frame = Union[Table, "pd.DataFrame"]

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
    "finish_reason",
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
    """Append-only rows, mutable lists from ``append_mutable`` (per-request fields are filled in as
    events happen), turned into a :class:`~sim.replay.table.Table` at the end."""

    def __init__(self, columns: tuple[str, ...]) -> None:
        self.columns = columns
        self.rows: list[list[Any]] = []

    def append_mutable(self, *values: Any) -> list[Any]:
        row = list(values)
        self.rows.append(row)
        return row

    def __len__(self) -> int:
        return len(self.rows)

    def to_table(self) -> Table:
        return Table.from_rows(self.columns, self.rows)


def as_frame(table: Frame) -> pd.DataFrame:
    """The DataFrame of a Table (``Table.to_frame``), or the DataFrame itself."""
    return table.to_frame() if isinstance(table, Table) else table


_LATENCY_INPUTS = ("arrival", "first_scheduled", "first_token", "finish", "output_tokens")


def finalize_requests(requests: Frame) -> Frame:
    """Add the derived latency columns (seconds): ``ttft``, ``queue_time``, ``e2e``, ``tpot``
    (NaN for a request of one output token). A :class:`Table` whose inputs are numeric arrays
    gets them from numpy and stays a Table, and so does an empty one (no pandas for an idle fleet
    replica); anything else (a DataFrame, or a Table with ``None`` only in a time column: every
    request rejected) is computed by pandas as a DataFrame -- the same values either way."""
    if isinstance(requests, Table):
        if not len(requests):  # no rows (an idle fleet replica): every column ``object`` either way
            return requests.with_columns(ttft=[], queue_time=[], e2e=[], tpot=[])
        if not requests.numeric(*_LATENCY_INPUTS):
            return finalize_requests(requests.to_frame())
        arrival, first_token, finish, out = (_values(requests, c) for c in ("arrival", "first_token", "finish",
                                                                             "output_tokens"))
        with np.errstate(invalid="ignore"):
            tpot = (finish - first_token) / np.where(out > 1, out - 1, np.nan)
        return requests.with_columns(
            ttft=first_token - arrival, queue_time=_values(requests, "first_scheduled") - arrival,
            e2e=finish - arrival, tpot=tpot,
        )
    df = requests.copy()
    df["ttft"] = df["first_token"] - df["arrival"]
    df["queue_time"] = df["first_scheduled"] - df["arrival"]
    df["e2e"] = df["finish"] - df["arrival"]
    denom = (df["output_tokens"] - 1).where(df["output_tokens"] > 1)
    df["tpot"] = (df["finish"] - df["first_token"]) / denom
    return df


def _values(table: Frame, name: str) -> np.ndarray:
    return np.asarray(table[name])


def _mean(x: np.ndarray) -> float:
    """pandas' ``Series.mean()``, bit for bit: NaN skipped (summed as 0), the sum in float64 over
    the count of the others."""
    if x.dtype.kind == "f":
        nan = np.isnan(x)
        count = len(x) - int(nan.sum())
        if not count:
            return math.nan
        if count != len(x):
            x = np.where(nan, 0.0, x)
        return float(x.sum(dtype=np.float64) / count)
    return float(x.sum(dtype=np.float64) / len(x)) if len(x) else math.nan


def nan_percentile(x: np.ndarray, q: float) -> float:
    """``np.percentile`` of the non-NaN values, NaN when there are none (what pandas' ``quantile``
    of a column with missing values gives)."""
    x = x[~np.isnan(x)] if x.dtype.kind == "f" else x
    return float(np.percentile(x, q)) if len(x) else math.nan


def summarize(
    requests: Frame,
    steps: Frame,
    stats: PrefixCacheStats,
    *,
    sim_time_s: float,
    num_evictions: int,
) -> dict[str, Any]:
    """Headline metrics of a run (JSON-serialisable); rejected requests are only counted.
    ``requests`` and ``steps`` are Tables or DataFrames (the same figures, to the bit)."""
    keep: np.ndarray | None = None
    num_rejected = 0
    if "status" in requests:
        rejected = _values(requests, "status") == "rejected"
        num_rejected = int(rejected.sum())
        if num_rejected:
            keep = ~rejected
    n = len(requests) - num_rejected

    def col(name: str) -> np.ndarray:
        x = _values(requests, name)
        return x[keep] if keep is not None else x

    prompt = int(col("prompt_tokens").sum()) if n else 0
    outputs = int(col("output_tokens").sum()) if n else 0
    hits = col("hit_tokens") if n else np.zeros(0)
    hit_first = int(hits.sum()) if n else 0
    with_hit = int((hits > 0).sum()) if n else 0
    prefix_rate = (stats.hits / stats.queries) if stats.queries else 0.0
    first_rate = (hit_first / prompt) if prompt else 0.0
    span = (float(np.nanmax(col("finish"))) - float(np.nanmin(col("arrival")))) if n else 0.0
    out: dict[str, Any] = {
        "num_requests": n,
        "num_rejected_requests": num_rejected,
        "num_length_capped_requests": int((col("finish_reason") == "length_capped").sum())
        if n and "finish_reason" in requests else 0,
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
        "num_preemptions": int(col("num_preemptions").sum()) if n else 0,
        "num_evictions": num_evictions,
        "sim_time_s": sim_time_s,
        "throughput_requests_per_s": n / span if span > 0 else math.nan,
        "throughput_output_tokens_per_s": outputs / span if span > 0 else math.nan,
        "throughput_total_tokens_per_s": (prompt + outputs) / span if span > 0 else math.nan,
        "mean_batch_size": _mean(_values(steps, "batch_size")) if len(steps) else 0.0,
    }
    for metric in ("ttft", "tpot", "e2e", "queue_time"):
        x = col(metric).astype(np.float64) if n else None
        out[f"{metric}_mean_s"] = _mean(x) if x is not None else math.nan
        for q in (50, 90, 99):
            out[f"{metric}_p{q}_s"] = nan_percentile(x, q) if x is not None else math.nan
    return out

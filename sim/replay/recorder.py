"""What a replay records as it goes: one row per request, one row per step, prefix-cache totals.

The engine calls ``new_request`` on arrival, ``admitted`` / ``first_token`` / ``finished`` as they
happen, ``step`` once per engine step and ``add_stats`` with each step's drained PrefixCacheStats;
``tables`` turns the rows into the result tables (columns in ``sim.replay.metrics``): the step
rows go into int64 / float64 columns as they come (``sim.replay.column_table.NumericColumnTable``),
the request rows stay rows (their fields are filled in as events happen).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from sim.core.prefix_cache_stats import PrefixCacheStats
from sim.core.request import Request
from sim.replay.column_table import NumericColumnTable
from sim.replay.metrics import REQUEST_COLUMNS, STEP_COLUMNS, Frame, RecordTable, finalize_requests
from sim.replay.table import Table, typed_column

TIER_COLUMNS = ("external_hit_tokens", "readmit_external_hit_tokens", "kv_wait_steps")
"""The request columns of a replay with a CPU offload tier: the CPU tier's hit at first admission
(``hit_tokens`` is the GPU's), the re-admissions' CPU hits (``;``-joined, like
``readmit_hit_tokens``), and the steps the request spent in ``WAITING_FOR_REMOTE_KVS``."""

_COL = {name: i for i, name in enumerate(REQUEST_COLUMNS)}
_FIRST_SCHEDULED, _FIRST_TOKEN, _FINISH = _COL["first_scheduled"], _COL["first_token"], _COL["finish"]
_HIT_TOKENS, _READMIT, _PREEMPTIONS = _COL["hit_tokens"], _COL["readmit_hit_tokens"], _COL["num_preemptions"]
_OUTPUT_TOKENS, _STATUS, _FINISH_REASON = _COL["output_tokens"], _COL["status"], _COL["finish_reason"]


class _Progress:
    """A tqdm bar over finished requests, or nothing."""

    def __init__(self, enabled: bool, total: int | Callable[[], int] | None) -> None:
        self.bar = None
        if enabled:
            from tqdm import tqdm

            count = total() if callable(total) else total  # a deferred count runs only for the bar
            self.bar = tqdm(total=count, unit="req", desc="replay", mininterval=0.5, smoothing=0.05)

    def update(self, n: int) -> None:
        if self.bar is not None and n:
            self.bar.update(n)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


class ReplayRecorder:
    """Per-request and per-step rows of one replay, plus the summed prefix-cache stats."""

    def __init__(self, progress: bool = False, total: int | Callable[[], int] | None = None) -> None:
        self._rows: dict[str, list[Any]] = {}  # request id -> its (mutable) row
        self._requests = RecordTable(REQUEST_COLUMNS)
        self._steps = NumericColumnTable(STEP_COLUMNS)
        self.stats = PrefixCacheStats()
        self._progress = _Progress(progress, total)
        # with a CPU offload tier: request id -> [external_hit_tokens, readmit_external_hit_tokens,
        # kv_wait_steps], the columns TIER_COLUMNS adds (None: no tier, no such columns)
        self._tier: dict[str, list[Any]] | None = None

    def enable_tier(self) -> None:
        """Changes state: the request table gets the CPU tier's columns (``TIER_COLUMNS``)."""
        self._tier = {}

    def new_request(
        self, request_id: str, arrival: float, prompt_tokens: int, output_tokens: int, salt: str | None,
        lora: str | None, tenant: str | None, session: str | None, prompt_logprobs: bool,
        reject_reason: str | None = None,
    ) -> None:
        """A request's row on arrival; a rejected one (``reject_reason`` set) stays ``rejected``,
        with no timings and no hit tokens."""
        if request_id in self._rows:
            raise ValueError(f"duplicate request id {request_id!r}")
        self._rows[request_id] = self._requests.append_mutable(
            request_id, arrival, None, None, None, prompt_tokens, output_tokens, None, 0, "",
            salt, lora, tenant, session, prompt_logprobs, "rejected" if reject_reason else "", reject_reason or "", "",
        )

    def admitted(self, request: Request, hit_tokens: int, now: float, external_hit_tokens: int = 0) -> None:
        """First admission sets ``first_scheduled``/``hit_tokens`` (and, with a tier, the CPU hit
        ``external_hit_tokens``); later ones add a re-admission hit."""
        row = self._rows[request.request_id]
        first = row[_FIRST_SCHEDULED] is None
        if first:
            row[_FIRST_SCHEDULED] = now
            row[_HIT_TOKENS] = hit_tokens
        else:
            prev = row[_READMIT]
            row[_READMIT] = f"{prev};{hit_tokens}" if prev else str(hit_tokens)
            row[_PREEMPTIONS] = request.num_preemptions
        if self._tier is not None:
            t = self._tier.setdefault(request.request_id, [0, "", 0])
            if first:
                t[0] = external_hit_tokens
            else:
                t[1] = f"{t[1]};{external_hit_tokens}" if t[1] else str(external_hit_tokens)

    def forget(self, request_id: str) -> None:
        """Drop an unfinished request's row (a replica that went down hands it to another one)."""
        row = self._rows.pop(request_id)
        self._requests.rows = [r for r in self._requests.rows if r is not row]

    def first_token(self, request: Request, now: float) -> None:
        self._rows[request.request_id][_FIRST_TOKEN] = now

    def finished(self, request: Request, now: float) -> None:
        row = self._rows[request.request_id]
        row[_FINISH] = now
        row[_STATUS] = "finished"
        row[_PREEMPTIONS] = request.num_preemptions
        made = len(request.output_token_ids)
        # fewer than asked: the scheduler stopped it at max_model_len (vLLM FINISHED_LENGTH_CAPPED)
        row[_FINISH_REASON] = "length_capped" if made < row[_OUTPUT_TOKENS] else "max_tokens"
        row[_OUTPUT_TOKENS] = made
        if self._tier is not None:
            self._tier.setdefault(request.request_id, [0, "", 0])[2] = request.num_steps_waiting_for_kv
        self._progress.update(1)

    def step(self, *values: Any) -> None:
        """One step row, in ``STEP_COLUMNS`` order."""
        self._steps.append(*values)

    def steps(self, *columns: Sequence[Any], ends: Sequence[float] | None = None) -> None:
        """Several step rows given as columns (lists, or arrays for a window's constant columns:
        ``NumericColumnTable.extend``), in ``STEP_COLUMNS`` order (a fast-forward window).
        ``ends``: each row's start + duration when the caller has those floats already (a window's
        next step starts), for a subclass reporting step ends (``sim.cluster.replica``)."""
        self._steps.extend(*columns)

    def add_stats(self, stats: PrefixCacheStats | None) -> None:
        if stats is not None:
            self.stats.add(stats)

    def close(self) -> None:
        self._progress.close()

    def tables(self) -> tuple[Frame, Table]:
        """(requests with the derived latency columns, steps): Tables (the requests a DataFrame in
        the corner case of ``finalize_requests``); ``.to_frame()`` of each, or
        :func:`sim.replay.metrics.as_frame`, gives the DataFrames."""
        return self.request_table(), self._steps.to_table()

    @property
    def step_columns(self) -> NumericColumnTable:
        """The step rows as recorded (read it, do not change it: a fleet joins its replicas' step
        columns in one go, ``sim.replay.column_table.join_numeric``)."""
        return self._steps

    def request_table(self) -> Frame:
        """The requests of :meth:`tables`."""
        requests = finalize_requests(self._requests.to_table())
        if self._tier is not None:
            cols = list(zip(*(self._tier.get(row[0], (0, "", 0)) for row in self._requests.rows), strict=True))
            values = dict(zip(TIER_COLUMNS, (list(c) for c in cols), strict=True)) if cols else {
                name: [] for name in TIER_COLUMNS}
            if isinstance(requests, Table):
                requests = requests.with_columns(**{k: typed_column(v) for k, v in values.items()})
            else:
                for k, v in values.items():
                    requests[k] = v
        return requests

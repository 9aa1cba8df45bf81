"""What the miss attribution of :mod:`sim.replay.attribution` records, and the tables it becomes.

Mirrors nothing in vLLM. Per request, token counts per cause (the ``miss_<cause>_tokens`` columns
of ``requests.*``); per run, their sums (``summary.json``: ``miss_attribution``, cause -> missed
prompt tokens, and ``miss_attribution_isolation``, key -> tokens); with ``replay.attribution:
full`` also one row per block of every request at its first admission (``blocks.parquet``, read by
``apcsim explain``).

Invariants: a request's causes add up to ``prompt_tokens - hit_tokens`` (checked as each request
is recorded: an AssertionError names it); cause codes follow the precedence order, so the first
cause is the smallest code. Imports pandas only when a table is built, never simpy.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from sim.core.request import Request

if TYPE_CHECKING:  # pandas is imported when a table is built: a replay without tables never loads it
    import pandas as pd

SKIP, LAST_TOKEN, PARTIAL_BLOCK, EAGLE = 0, 1, 2, 3
ISOLATION_SALT, ISOLATION_LORA, ISOLATION_MM = 4, 5, 6
IN_FLIGHT, EVICTED, UNREACHABLE, COLD = 7, 8, 9, 10
CODE_NAMES = ("skip", "last_token", "partial_block", "eagle", "isolation_salt", "isolation_lora", "isolation_mm",
              "in_flight", "evicted", "unreachable", "cold")
"""Cause names by code, in precedence order (the isolation split by the key that differs)."""

CAUSES = ("skip", "last_token", "partial_block", "eagle", "isolation", "in_flight", "evicted", "unreachable", "cold")
"""The causes of ``summary.json``'s ``miss_attribution``, in precedence order; they add up to the
missed prompt tokens (``prompt_tokens`` minus first-admission ``hit_tokens``)."""
ISOLATION_KEYS = ("salt", "lora", "mm")
"""The extra keys an ``isolation`` miss is split by (``miss_attribution_isolation``)."""

REQUEST_MISS_COLUMNS = tuple(
    f"miss_{c}_tokens" for c in ("skip", "last_token", "partial_block", "eagle", "isolation", "isolation_salt",
                                 "isolation_lora", "isolation_mm", "in_flight", "evicted", "unreachable", "cold")
)
"""The per-request columns the attribution adds to ``requests.*`` (``miss_isolation_tokens`` is
the sum of its three splits)."""

BLOCK_COLUMNS = (
    "request_id", "block", "start", "end", "group", "hash", "hit", "cause", "tokens_short", "in_flight_by",
    "cached_step", "cached_by", "evicted_step", "evicted_for", "evicted_block_id", "evict_reason",
    "other_namespace", "other_request",
)
"""``blocks.parquet``: one row per scheduler block of a request's prompt at its first admission
(the trailing partial block included): token range ``[start, end)``, the key's hex (``hash``, none
for a partial block), ``hit``, ``cause`` (``hit`` for a hit) and what explains it."""
_DETAILS = BLOCK_COLUMNS[8:]

BlockRow = tuple[int, int, bytes, int, dict[str, Any]] | None
"""A missed block as the attribution classified it: (block, group, key, cause code, details);
None below the ``full`` level."""


class AttributionRecords:
    """Counts per request (and, ``full``, block rows), filled as requests are first admitted."""

    def __init__(self, full: bool, hash_block_size: int) -> None:
        self.full = full
        self.hash_block_size = hash_block_size  # of the chains handed to add_request
        self.counts: dict[str, list[int]] = {}
        self.rows: list[tuple[Any, ...]] = []

    def add_request(
        self,
        r: Request,
        num_hits: int,
        block_size: int,
        *,
        skip: bool = False,
        causes: Sequence[int] = (),
        blocks: dict[int, int] | None = None,
        rows: Sequence[BlockRow] | None = None,
        hashes: Sequence[bytes] = (),
    ) -> None:
        """Record one request's first admission (``causes``: one code per missed block in the lookup
        range, in block order, or ``blocks``: their count per code; ``rows`` the blocks classified
        at the ``full`` level)."""
        p = r.num_prompt_tokens
        n_full, cap = p // block_size, (p - 1) // block_size
        counts = [0] * len(CODE_NAMES)
        if skip:
            counts[SKIP] = p
        else:
            counts[LAST_TOKEN] = (n_full - cap) * block_size
            counts[PARTIAL_BLOCK] = p - n_full * block_size
            for c in causes:
                counts[c] += block_size
            for c, n in (blocks or {}).items():
                counts[c] += n * block_size
        if sum(counts) != p - num_hits:
            raise AssertionError(
                f"{r.request_id}: miss causes add up to {sum(counts)} tokens, but {p} prompt tokens - "
                f"{num_hits} hits = {p - num_hits} missed"
            )
        self.counts[r.request_id] = counts
        if self.full:
            self._add_rows(r, num_hits, block_size, skip, rows or (), hashes)

    def _add_rows(self, r: Request, num_hits: int, bs: int, skip: bool, rows: Sequence[BlockRow],
                  hashes: Sequence[bytes]) -> None:
        rid, p = r.request_id, r.num_prompt_tokens
        n_full, cap, first = p // bs, (p - 1) // bs, num_hits // bs
        step = bs // self.hash_block_size  # scheduler block j is named by chain hash (j + 1) * step - 1
        empty: tuple[None, ...] = (None,) * len(_DETAILS)

        def key_hex(j: int) -> str | None:
            raw = (j + 1) * step - 1
            return hashes[raw].hex() if raw < len(hashes) else None

        out = self.rows
        for j in range(n_full):
            start, end = j * bs, (j + 1) * bs
            if skip:
                out.append((rid, j, start, end, 0, key_hex(j), False, "skip", *empty))
            elif j < first:
                out.append((rid, j, start, end, 0, key_hex(j), True, "hit", *empty))
            elif j >= cap:
                out.append((rid, j, start, end, 0, key_hex(j), False, "last_token", *empty))
            else:
                row = rows[j - first]
                assert row is not None
                _, gid, key, cause, details = row
                out.append((rid, j, start, end, gid, key.hex(), False, CODE_NAMES[cause],
                            *(details.get(c) for c in _DETAILS)))
        if p > n_full * bs:
            short = (n_full + 1) * bs - p  # tokens the partial block lacks to be full
            out.append((rid, n_full, n_full * bs, p, 0, None, False, "skip" if skip else "partial_block", short,
                        *empty[1:]))

    # -- tables -------------------------------------------------------------------------------
    def request_columns(self, request_ids: Sequence[str]) -> dict[str, list[int]]:
        """The ``miss_<cause>_tokens`` columns for requests in this order (0 for one never admitted)."""
        zero = [0] * len(CODE_NAMES)
        cols: dict[str, list[int]] = {c: [] for c in REQUEST_MISS_COLUMNS}
        for rid in request_ids:
            c = self.counts.get(rid, zero)
            for name, v in zip(REQUEST_MISS_COLUMNS, _request_values(c)):
                cols[name].append(v)
        return cols

    def summary(self) -> dict[str, Any]:
        """``miss_attribution`` (cause -> missed prompt tokens) and ``miss_attribution_isolation``."""
        total = [0] * len(CODE_NAMES)
        for c in self.counts.values():
            for i, v in enumerate(c):
                total[i] += v
        by_cause = dict(zip(CAUSES, _summary_values(total)))
        iso = dict(zip(ISOLATION_KEYS, total[ISOLATION_SALT:ISOLATION_MM + 1]))
        return {"miss_attribution": by_cause, "miss_attribution_isolation": iso}

    def blocks_table(self) -> pd.DataFrame | None:
        """``blocks.parquet`` (``full`` level only, else None)."""
        if not self.full:
            return None
        import pandas as pd

        return pd.DataFrame.from_records(self.rows, columns=list(BLOCK_COLUMNS))


def _request_values(c: list[int]) -> list[int]:
    iso = c[ISOLATION_SALT] + c[ISOLATION_LORA] + c[ISOLATION_MM]
    return [c[SKIP], c[LAST_TOKEN], c[PARTIAL_BLOCK], c[EAGLE], iso, c[ISOLATION_SALT], c[ISOLATION_LORA],
            c[ISOLATION_MM], c[IN_FLIGHT], c[EVICTED], c[UNREACHABLE], c[COLD]]


def _summary_values(c: list[int]) -> list[int]:
    iso = c[ISOLATION_SALT] + c[ISOLATION_LORA] + c[ISOLATION_MM]
    return [c[SKIP], c[LAST_TOKEN], c[PARTIAL_BLOCK], c[EAGLE], iso, c[IN_FLIGHT], c[EVICTED], c[UNREACHABLE], c[COLD]]


def check_attribution(requests: pd.DataFrame) -> None:
    """Assert that every request's miss columns add up to its missed prompt tokens (and the
    isolation split to ``miss_isolation_tokens``); raises AssertionError naming the first bad one.
    A request rejected at intake (``status`` ``rejected``) was never looked up: its columns are 0."""
    if "status" in requests:
        requests = requests[requests["status"] != "rejected"]
    top = [f"miss_{c}_tokens" for c in CAUSES]
    total = requests[top].sum(axis=1)
    bad = requests[total != requests["prompt_tokens"] - requests["hit_tokens"]]
    if len(bad):
        r = bad.iloc[0]
        raise AssertionError(f"{r['request_id']}: miss causes {int(total[bad.index[0]])} != "
                             f"{int(r['prompt_tokens'])} - {int(r['hit_tokens'])}")
    split = requests[[f"miss_isolation_{k}_tokens" for k in ISOLATION_KEYS]].sum(axis=1)
    if (split != requests["miss_isolation_tokens"]).any():
        raise AssertionError("isolation split does not add up to miss_isolation_tokens")

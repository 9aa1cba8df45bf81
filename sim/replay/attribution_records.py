"""What the miss attribution of :mod:`sim.replay.attribution` records, and the tables it becomes.

Mirrors nothing in vLLM. Per request, token counts per cause (the ``miss_<cause>_tokens`` columns
of ``requests.*``); per run, their sums (``summary.json``: ``miss_attribution``, cause -> missed
prompt tokens, and ``miss_attribution_isolation``, key -> tokens); with ``replay.attribution:
full`` also one row per block of every request at its first admission (``blocks.parquet``, read by
``apcsim explain``).

With a CPU offload tier (:mod:`sim.replay.attribution_tier`) the tokens a first admission loads
from the tier are a hit source, not a miss: ``summary.json`` gets ``miss_attribution_hits``
(``gpu_hit`` and ``cpu_hit`` tokens, beside the causes), ``miss_attribution`` and ``requests.*`` the
cause ``cpu_partial_chunk``, and ``blocks.parquet`` the rows ``cpu_hit`` and the columns
``cpu_chunk`` and ``cpu_state``; none of it without a tier (untiered tables are unchanged). A
fleet's shared KV store is its replicas' tier (``sim.cluster.kv_store``): its loads are the hit source
``remote_hit`` (``miss_attribution_hits``, ``blocks.parquet``) instead of ``cpu_hit``.

In a cluster replay (:mod:`sim.replay.attribution_fleet`) each replica's records add the cause
``routed_away`` (``miss_routed_away_tokens``, ``miss_attribution.routed_away``) and the
``blocks.parquet`` column ``resident_on``; none of it in a single-engine run.

Invariants: a request's causes add up to ``prompt_tokens - hit_tokens - external_hit_tokens`` (the
CPU hit: 0 without a tier; checked as each request is recorded: an AssertionError names it); cause
codes of the per-block causes follow the precedence order, so the first cause is the smallest code
(``cpu_partial_chunk``, appended last, never competes: the tier models one full-attention group).
Imports pandas only when a table is built, never simpy.
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
CPU_PARTIAL_CHUNK = 11
ROUTED_AWAY = 12
CODE_NAMES = ("skip", "last_token", "partial_block", "eagle", "isolation_salt", "isolation_lora", "isolation_mm",
              "in_flight", "evicted", "unreachable", "cold", "cpu_partial_chunk", "routed_away")
"""Cause names by code, in precedence order (the isolation split by the key that differs), then
the CPU tier's own cause and the fleet's (``sim.replay.attribution_fleet``: it is decided per
scheduler block, for all of a block's group blocks alike, so it never competes by code)."""
CPU_HIT = "cpu_hit"
"""The ``cause`` of a ``blocks.parquet`` row the admission loaded from the CPU tier (a hit)."""
REMOTE_HIT = "remote_hit"
"""The same for a fleet's shared KV store (``sim.cluster.kv_store``: the store is the replicas' tier),
and its key in ``miss_attribution_hits`` (``cpu_hit`` for a CPU tier)."""

CAUSES = ("skip", "last_token", "partial_block", "eagle", "isolation", "in_flight", "evicted", "unreachable", "cold")
"""The causes of ``summary.json``'s ``miss_attribution``, in precedence order; they add up to the
missed prompt tokens (``prompt_tokens`` minus first-admission ``hit_tokens``)."""
TIER_CAUSES = CAUSES[:7] + ("cpu_partial_chunk",) + CAUSES[7:]
"""The causes with a CPU tier (``evicted`` then reads: evicted from both tiers); they add up to
``prompt_tokens`` minus the first admissions' ``hit_tokens`` and ``external_hit_tokens``."""
FLEET_CAUSE = "routed_away"
"""The cause a cluster replay adds (``sim.replay.attribution_fleet``); listed after ``eagle``."""
ISOLATION_KEYS = ("salt", "lora", "mm")
"""The extra keys an ``isolation`` miss is split by (``miss_attribution_isolation``)."""

REQUEST_MISS_COLUMNS = tuple(
    f"miss_{c}_tokens" for c in ("skip", "last_token", "partial_block", "eagle", "isolation", "isolation_salt",
                                 "isolation_lora", "isolation_mm", "in_flight", "evicted", "unreachable", "cold")
)
"""The per-request columns the attribution adds to ``requests.*`` (``miss_isolation_tokens`` is
the sum of its three splits)."""
TIER_MISS_COLUMNS = REQUEST_MISS_COLUMNS + ("miss_cpu_partial_chunk_tokens",)
"""The same with a CPU tier."""
FLEET_MISS_COLUMN = "miss_routed_away_tokens"
"""The column a cluster replay adds (after the others)."""


def causes_for(tier: bool, fleet: bool) -> tuple[str, ...]:
    """The causes of a run, in ``miss_attribution``'s order: :data:`CAUSES`, with a CPU tier
    :data:`TIER_CAUSES`, in a cluster replay with ``routed_away`` after ``eagle``."""
    base = TIER_CAUSES if tier else CAUSES
    return base[:4] + (FLEET_CAUSE,) + base[4:] if fleet else base


def table_causes(columns: Sequence[str]) -> tuple[str, ...]:
    """:func:`causes_for` of a requests table with these columns."""
    return causes_for("miss_cpu_partial_chunk_tokens" in columns, FLEET_MISS_COLUMN in columns)

BLOCK_COLUMNS = (
    "request_id", "block", "start", "end", "group", "hash", "hit", "cause", "tokens_short", "in_flight_by",
    "cached_step", "cached_by", "evicted_step", "evicted_for", "evicted_block_id", "evict_reason",
    "other_namespace", "other_request",
)
"""``blocks.parquet``: one row per scheduler block of a request's prompt at its first admission
(the trailing partial block included): token range ``[start, end)``, the key's hex (``hash``, none
for a partial block), ``hit``, ``cause`` (``hit`` for a hit) and what explains it."""
TIER_BLOCK_COLUMNS = BLOCK_COLUMNS + ("cpu_chunk", "cpu_state")
"""``blocks.parquet`` with a CPU tier: a row's offload chunk and how the tier held it at the lookup
(``loaded`` for a ``cpu_hit``; ``ready`` or ``pending`` for a missed block the tier held; none)."""
FLEET_BLOCK_COLUMN = "resident_on"
"""``blocks.parquet`` of a cluster replay: the other replica a ``routed_away`` block was resident on
at the routing (inserted before the tier's columns)."""


def block_columns(tier: bool, fleet: bool) -> tuple[str, ...]:
    """``blocks.parquet``'s columns: :data:`BLOCK_COLUMNS`, the fleet's, then the tier's."""
    return BLOCK_COLUMNS + ((FLEET_BLOCK_COLUMN,) if fleet else ()) + (TIER_BLOCK_COLUMNS[len(BLOCK_COLUMNS):]
                                                                        if tier else ())

BlockRow = tuple[int, int, bytes, int, dict[str, Any]] | None
"""A missed block as the attribution classified it: (block, group, key, cause code, details);
None below the ``full`` level."""


class AttributionRecords:
    """Counts per request (and, ``full``, block rows), filled as requests are first admitted."""

    def __init__(self, full: bool, hash_block_size: int, blocks_per_chunk: int | None = None, *,
                 fleet: bool = False, ext_hit: str = CPU_HIT) -> None:
        self.full = full
        self.hash_block_size = hash_block_size  # of the chains handed to add_request
        self.blocks_per_chunk = blocks_per_chunk  # the CPU tier's chunk (None: no tier)
        self.tier = blocks_per_chunk is not None
        self.fleet = fleet  # a cluster replay's replica: the routed_away column and cause
        self.ext_hit = ext_hit  # the tier's hit source: CPU_HIT, or REMOTE_HIT for a fleet's shared store
        self.columns = block_columns(self.tier, fleet)
        self.details = self.columns[8:]
        self.counts: dict[str, list[int]] = {}
        self.hits: dict[str, tuple[int, int]] = {}  # with a tier: request -> (GPU hit, CPU hit) tokens
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
        ext: int = 0,
    ) -> None:
        """Record one request's first admission (``causes``: one code per missed block in the lookup
        range past both hits, in block order, or ``blocks``: their count per code; ``rows`` the
        blocks classified at the ``full`` level; ``ext`` the CPU hit tokens after the ``num_hits``
        GPU hit tokens)."""
        p = r.num_prompt_tokens
        n_full, cap = p // block_size, (p - 1) // block_size
        counts = [0] * len(CODE_NAMES)
        if skip:
            counts[SKIP] = p
        else:  # a CPU hit may cover the last full block (the connector's lookup is bounded by P)
            counts[LAST_TOKEN] = (n_full - max(cap, (num_hits + ext) // block_size)) * block_size
            counts[PARTIAL_BLOCK] = p - n_full * block_size
            for c in causes:
                counts[c] += block_size
            for c, n in (blocks or {}).items():
                counts[c] += n * block_size
        if sum(counts) != p - num_hits - ext:
            raise AssertionError(
                f"{r.request_id}: miss causes add up to {sum(counts)} tokens, but {p} prompt tokens - "
                f"{num_hits} hits - {ext} CPU hits = {p - num_hits - ext} missed"
            )
        self.counts[r.request_id] = counts
        if self.tier:
            self.hits[r.request_id] = (num_hits, ext)
        if self.full:
            self._add_rows(r, num_hits, ext, block_size, skip, rows or (), hashes)

    def _add_rows(self, r: Request, num_hits: int, ext: int, bs: int, skip: bool, rows: Sequence[BlockRow],
                  hashes: Sequence[bytes]) -> None:
        rid, p = r.request_id, r.num_prompt_tokens
        n_full, cap, first = p // bs, (p - 1) // bs, num_hits // bs
        loaded = (num_hits + ext) // bs  # the CPU hit's blocks are [first, loaded)
        step = bs // self.hash_block_size  # scheduler block j is named by chain hash (j + 1) * step - 1
        details = self.details
        empty: tuple[None, ...] = (None,) * len(details)
        bpc = self.blocks_per_chunk or 1

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
            elif j < loaded:
                out.append((rid, j, start, end, 0, key_hex(j), True, self.ext_hit, *empty[:-2], j // bpc,
                            "loaded"))
            elif j >= cap:
                out.append((rid, j, start, end, 0, key_hex(j), False, "last_token", *empty))
            else:
                row = rows[j - loaded]
                assert row is not None
                _, gid, key, cause, info = row
                out.append((rid, j, start, end, gid, key.hex(), False, CODE_NAMES[cause],
                            *(info.get(c) for c in details)))
        if p > n_full * bs:
            short = (n_full + 1) * bs - p  # tokens the partial block lacks to be full
            out.append((rid, n_full, n_full * bs, p, 0, None, False, "skip" if skip else "partial_block", short,
                        *empty[1:]))

    # -- tables -------------------------------------------------------------------------------
    def request_columns(self, request_ids: Sequence[str]) -> dict[str, list[int]]:
        """The ``miss_<cause>_tokens`` columns for requests in this order (0 for one never admitted)."""
        zero = [0] * len(CODE_NAMES)
        names = TIER_MISS_COLUMNS if self.tier else REQUEST_MISS_COLUMNS
        names += (FLEET_MISS_COLUMN,) if self.fleet else ()
        cols: dict[str, list[int]] = {c: [] for c in names}
        for rid in request_ids:
            c = self.counts.get(rid, zero)
            for name, v in zip(names, _request_values(c, self.tier)):
                cols[name].append(v)
        return cols

    def summary(self) -> dict[str, Any]:
        """``miss_attribution`` (cause -> missed prompt tokens) and ``miss_attribution_isolation``."""
        total = [0] * len(CODE_NAMES)
        for c in self.counts.values():
            for i, v in enumerate(c):
                total[i] += v
        values = _summary_values(total)
        if not self.tier:
            by_cause = dict(zip(CAUSES, values))
        else:  # cpu_partial_chunk goes before unreachable (TIER_CAUSES)
            by_cause = dict(zip(TIER_CAUSES, values[:7] + [total[CPU_PARTIAL_CHUNK]] + values[7:]))
        if self.fleet:
            by_cause = {c: total[ROUTED_AWAY] if c == FLEET_CAUSE else by_cause[c] for c in causes_for(self.tier, True)}
        iso = dict(zip(ISOLATION_KEYS, total[ISOLATION_SALT:ISOLATION_MM + 1]))
        out: dict[str, Any] = {"miss_attribution": by_cause, "miss_attribution_isolation": iso}
        if self.tier:
            out["miss_attribution_hits"] = {"gpu_hit": sum(h for h, _ in self.hits.values()),
                                            self.ext_hit: sum(e for _, e in self.hits.values())}
        return out

    def blocks_table(self) -> pd.DataFrame | None:
        """``blocks.parquet`` (``full`` level only, else None)."""
        if not self.full:
            return None
        import pandas as pd

        return pd.DataFrame.from_records(self.rows, columns=list(self.columns))


def _request_values(c: list[int], tier: bool) -> list[int]:
    """One request's values in the order of its columns (the tier's, when there, then the fleet's)."""
    iso = c[ISOLATION_SALT] + c[ISOLATION_LORA] + c[ISOLATION_MM]
    return [c[SKIP], c[LAST_TOKEN], c[PARTIAL_BLOCK], c[EAGLE], iso, c[ISOLATION_SALT], c[ISOLATION_LORA],
            c[ISOLATION_MM], c[IN_FLIGHT], c[EVICTED], c[UNREACHABLE], c[COLD],
            *((c[CPU_PARTIAL_CHUNK],) if tier else ()), c[ROUTED_AWAY]]


def _summary_values(c: list[int]) -> list[int]:
    iso = c[ISOLATION_SALT] + c[ISOLATION_LORA] + c[ISOLATION_MM]
    return [c[SKIP], c[LAST_TOKEN], c[PARTIAL_BLOCK], c[EAGLE], iso, c[IN_FLIGHT], c[EVICTED], c[UNREACHABLE], c[COLD]]


def check_attribution(requests: pd.DataFrame) -> None:
    """Assert that every request's miss columns add up to its missed prompt tokens (and the
    isolation split to ``miss_isolation_tokens``); raises AssertionError naming the first bad one.
    With a CPU tier (``external_hit_tokens``) the CPU hit is not missed. A request rejected at
    intake (``status`` ``rejected``) was never looked up: its columns are 0."""
    if "status" in requests:
        requests = requests[requests["status"] != "rejected"]
    tier = "miss_cpu_partial_chunk_tokens" in requests
    top = [f"miss_{c}_tokens" for c in table_causes(list(requests.columns))]
    total = requests[top].sum(axis=1)
    missed = requests["prompt_tokens"] - requests["hit_tokens"]
    if tier:
        missed = missed - requests["external_hit_tokens"]
    bad = requests[total != missed]
    if len(bad):
        r = bad.iloc[0]
        ext = f" - {int(r['external_hit_tokens'])} CPU" if tier else ""
        raise AssertionError(f"{r['request_id']}: miss causes {int(total[bad.index[0]])} != "
                             f"{int(r['prompt_tokens'])} - {int(r['hit_tokens'])}{ext}")
    split = requests[[f"miss_isolation_{k}_tokens" for k in ISOLATION_KEYS]].sum(axis=1)
    if (split != requests["miss_isolation_tokens"]).any():
        raise AssertionError("isolation split does not add up to miss_isolation_tokens")

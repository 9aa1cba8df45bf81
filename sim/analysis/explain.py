"""``apcsim explain``'s content: one request's prompt chain, block by block, with why each missed
block missed (mirrors nothing in vLLM; the causes are those of :mod:`sim.replay.attribution`,
recorded by a run with ``replay.attribution: full`` in ``blocks.parquet``).

:func:`explain` builds a JSON-ready mapping from a run folder, :func:`render` prints it: per block
its index, token range, short hash, hit or miss and cause, and for a miss what explains it -- when
and by which request the block was cached, when and for which request's allocation it was evicted,
which other namespace (salt, LoRA adapter, multimodal input) holds the same tokens, which running
request was computing it, how many tokens a partial block lacks. With a CPU offload tier a block the
admission loaded from it is a ``cpu_hit`` (a hit), a missed block the tier held names its chunk
(``cpu_partial_chunk``, or ``unreachable`` behind a gap), and ``evicted`` is evicted from both tiers.
A cluster run (``sim.cluster.fleet_attribution``) names the replica each request ran on and, for a
``routed_away`` block, the replica it was resident on when the request was routed; ``router`` picks
a router of ``cluster.compare`` (its tables are ``compared_requests.parquet`` /
``compared_blocks.parquet``, with a ``router`` column).

Invariants: reads the run folder only (``requests.*``, ``blocks.parquet``, ``config.resolved.yaml``
is not needed); a missing table is an :class:`ExplainError` that says how to record it. Imports
pandas, not simpy.
"""

from __future__ import annotations

import math
import textwrap
from pathlib import Path
from typing import Any

import pandas as pd

from sim.analysis.diagnosis import VOCABULARY
from sim.core.errors import ApcsimError
from sim.replay.attribution_records import CPU_HIT, ISOLATION_KEYS, table_causes

HASH_CHARS = 12
"""Hex characters of a block hash shown (the full key is in ``blocks.parquet``)."""

_DETAILS = ("tokens_short", "in_flight_by", "cached_step", "cached_by", "evicted_step", "evicted_for",
            "evicted_block_id", "evict_reason", "other_namespace", "other_request", "resident_on", "cpu_chunk",
            "cpu_state")
_COMPARED = ("compared_requests.parquet", "compared_blocks.parquet")  # sim.experiment.cluster_run


class ExplainError(ApcsimError, ValueError):
    """A run folder without what ``apcsim explain`` needs, or an unknown request."""


def _value(v: Any) -> Any:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return None
    return int(v) if isinstance(v, float) and v.is_integer() else (v.item() if hasattr(v, "item") else v)


def _requests(run_dir: Path) -> pd.DataFrame:
    for name, read in (("requests.parquet", pd.read_parquet), ("requests.csv", pd.read_csv)):
        if (run_dir / name).exists():
            return read(run_dir / name)
    raise ExplainError(f"{run_dir}: no requests.parquet or requests.csv (not a run folder of apcsim run)")


def _primary_router(run_dir: Path) -> str | None:
    """The label of a cluster run's own router (``llm_d (precise)``, ``sglang``), None for one engine."""
    import json

    try:
        router = (json.loads((run_dir / "summary.json").read_text()).get("cluster") or {}).get("router") or {}
    except (OSError, ValueError):
        return None
    return (f"{router['kind']} ({router['prefix']})" if router.get("prefix") else router.get("kind")) or None


def _router_tables(run_dir: Path, router: str | None) -> tuple[pd.DataFrame, Path, list[Any]]:
    """The requests, the blocks file and its row filters of ``router``'s replay (None or the run's own
    router: the run's tables; else a ``cluster.compare`` router's)."""
    if router is None or router == _primary_router(run_dir):
        return _requests(run_dir), run_dir / "blocks.parquet", []
    req_path, blocks_path = (run_dir / name for name in _COMPARED)
    primary = _primary_router(run_dir)
    if primary is None:
        raise ExplainError(f"{run_dir}: --router {router}: not a cluster run (one engine, one replay)")
    names = [primary]
    if req_path.exists():
        compared = pd.read_parquet(req_path)
        names += sorted(set(compared["router"].astype(str)))
        if router in names[1:]:
            return compared[compared["router"] == router], blocks_path, [("router", "==", router)]
    raise ExplainError(f"{run_dir}: no replay of router {router!r} (routers with tables: {', '.join(names)}; "
                       "cluster.compare routers are kept with replay.attribution on)")


def explain(run_dir: Path, request_id: str, router: str | None = None) -> dict[str, Any]:
    """The chain of ``request_id`` in the run at ``run_dir`` (see the module docstring); ``router``:
    a compared router's replay of a cluster run."""
    reqs, blocks_path, filters = _router_tables(run_dir, router)
    if not blocks_path.exists():
        raise ExplainError(f"{run_dir}: no {blocks_path.name}; rerun with --set replay.attribution=full")
    match = reqs[reqs["request_id"].astype(str) == request_id]
    if match.empty:
        some = ", ".join(map(str, reqs["request_id"].head(5)))
        raise ExplainError(f"{run_dir}: no request {request_id!r} (requests: {some}, ...)")
    row = match.iloc[0]
    blocks = pd.read_parquet(blocks_path, filters=[*filters, ("request_id", "==", request_id)])
    if "miss_skip_tokens" not in row.index:
        raise ExplainError(f"{run_dir}: requests without miss_<cause>_tokens columns (run without attribution)")
    tier = "miss_cpu_partial_chunk_tokens" in row.index  # a run with a CPU offload tier
    causes = {c: int(row[f"miss_{c}_tokens"]) for c in table_causes(list(row.index)) if row[f"miss_{c}_tokens"]}
    isolation = {k: int(row[f"miss_isolation_{k}_tokens"]) for k in ISOLATION_KEYS if row[f"miss_isolation_{k}_tokens"]}
    out_blocks = []
    for rec in blocks.sort_values("block").to_dict("records"):
        b = {k: _value(v) for k, v in rec.items()}
        entry = {k: b[k] for k in ("block", "start", "end", "group")}
        entry.update(hash=b["hash"][:HASH_CHARS] if isinstance(b["hash"], str) else None, hit=bool(b["hit"]),
                     cause=b["cause"])
        entry.update({k: b[k] for k in _DETAILS if b.get(k) is not None})
        out_blocks.append(entry)
    namespace = {k: _value(row.get(k)) for k in ("salt", "lora") if _value(row.get(k)) not in (None, "")}
    ext = int(row["external_hit_tokens"]) if tier else 0
    out: dict[str, Any] = {
        "request_id": request_id,
        "prompt_tokens": int(row["prompt_tokens"]),
        "hit_tokens": int(row["hit_tokens"]),
    }
    if tier:  # a fleet's shared store is its replicas' tier: its loads are remote hits
        out["remote_hit_tokens" if "remote_hit_tokens" in row.index else "cpu_hit_tokens"] = ext
    if "replica" in row.index:  # a cluster run: where it ran, under which router
        out.update(router=router or _primary_router(run_dir), replica=int(row["replica"]))
        if _value(row.get("prefill_replica")) is not None and int(row["prefill_replica"]) >= 0:
            out["prefill_replica"] = int(row["prefill_replica"])  # P/D: its hits are the prefill's
    out.update({
        "missed_tokens": int(row["prompt_tokens"]) - int(row["hit_tokens"]) - ext,
        "namespace": namespace,
        "prompt_logprobs": bool(_value(row.get("prompt_logprobs")) or False),
        "miss_tokens": causes,
        "miss_isolation_tokens": isolation,
        "blocks": out_blocks,
    })
    return out


def why(b: dict[str, Any], namespace: dict[str, Any], prompt_logprobs: bool = False, tier: bool = False) -> str:
    """One block's explanation, in words (``namespace`` and ``prompt_logprobs``: its request's;
    ``tier``: the run has a CPU offload tier)."""
    cause = b["cause"]
    cached = (f"cached at step {b['cached_step']} by {b['cached_by']}" if b.get("cached_by") is not None
              else "cached")
    held = f"held by the CPU tier (chunk {b.get('cpu_chunk')}, {b.get('cpu_state')})"
    if cause == "hit":
        return ""
    if cause == CPU_HIT:
        return f"loaded from the CPU tier (chunk {b.get('cpu_chunk')}) at admission"
    if cause == "cpu_partial_chunk":
        return (f"{held}, but the run past the GPU hit is under one chunk: vLLM loads whole chunks "
                "(hit < tokens_per_chunk -> 0)")
    if cause == "unreachable" and b.get("cpu_state") is not None:
        return f"{held}, but an earlier block missed in both tiers (hits are a contiguous prefix)"
    if cause == "skip":
        return ("prompt_logprobs: the request skips reading the prefix cache" if prompt_logprobs
                else "prefix caching is off")
    if cause == "last_token":
        return "the last prompt token is always recomputed: the whole fully cached last block is"
    if cause == "partial_block":
        return f"{b.get('tokens_short', '?')} tokens short of a full block: never cacheable at admission"
    if cause == "eagle":
        return f"{cached}; EAGLE drops the last matched block so the drafter recomputes it"
    if cause == "unreachable":
        return f"{cached}, but an earlier block of the chain missed (hits are a contiguous prefix)"
    if cause == "in_flight":
        return f"being computed by {b.get('in_flight_by')}, not yet cached at this admission"
    if cause == "evicted":
        reason = b.get("evict_reason")
        what = (f"for {b['evicted_for']}'s allocation" if reason == "reused" and b.get("evicted_for")
                else f"by {reason}")
        text = (f"{cached}; evicted at step {b.get('evicted_step')} (block {b.get('evicted_block_id')} reused {what})"
                if reason == "reused" else f"{cached}; evicted at step {b.get('evicted_step')} {what}")
        return text + ("; not in the CPU tier at this lookup (evicted from both tiers)" if tier else "")
    if cause.startswith("isolation_"):
        key = {"salt": "cache salt", "lora": "LoRA adapter", "mm": "multimodal input"}[cause[10:]]
        mine = ", ".join(f"{k} {v!r}" for k, v in namespace.items()) or "no salt, no LoRA"
        by = f" (from {b['other_request']})" if b.get("other_request") else ""
        return (f"the same tokens were computed under {b.get('other_namespace')}{by}; this request has {mine}: "
                f"the {key} differs")
    if cause == "cold":
        return "no request had produced these tokens before (compulsory miss)"
    if cause == "routed_away":
        return (f"replica {b.get('resident_on')} held it, and every block before it, when the request was routed; "
                "the router sent it elsewhere")
    return ""


def _runs(blocks: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Consecutive blocks with the same cause, hit and KV-cache group, in order."""
    runs: list[list[dict[str, Any]]] = []
    for b in blocks:
        last = runs[-1][-1] if runs else None
        if last is not None and (last["cause"], last["hit"], last["group"]) == (b["cause"], b["hit"], b["group"]):
            runs[-1].append(b)
        else:
            runs.append([b])
    return runs


def render(e: dict[str, Any], all_blocks: bool = False) -> str:
    """``apcsim explain``'s text: a header, the causes, then one line per run of consecutive blocks
    with the same cause (``all_blocks``: one line per block), and the vocabulary mapping."""
    ns = ", ".join(f"{k} {v!r}" for k, v in e["namespace"].items()) or "no salt, no LoRA"
    ext_key = "remote_hit_tokens" if "remote_hit_tokens" in e else "cpu_hit_tokens"
    tier = ext_key in e
    width = 17 if tier else 15  # the cause column fits cpu_partial_chunk
    source = "remote" if ext_key == "remote_hit_tokens" else "CPU"
    hits = f"{e['hit_tokens']} GPU hit, {e[ext_key]} {source} hit" if tier else f"{e['hit_tokens']} hit"
    where = f" on replica {e['replica']} ({e['router']} router)" if "replica" in e else ""
    if "prefill_replica" in e:  # (a disaggregated fleet: the prompt's hits happened on the prefill replica)
        where = f" prefilled on replica {e['prefill_replica']}, decoded on {e['replica']} ({e['router']} router)"
    lines = [
        f"request {e['request_id']}{where}: {e['prompt_tokens']} prompt tokens, {hits}, "
        f"{e['missed_tokens']} missed ({ns}{', prompt_logprobs' if e['prompt_logprobs'] else ''})",
        "missed tokens by cause: " + (", ".join(
            f"{k} {v}" + (" (" + ", ".join(f"{i} {n}" for i, n in e["miss_isolation_tokens"].items()) + ")"
                          if k == "isolation" else "") for k, v in e["miss_tokens"].items()) or "none"),
        "",
        f"{'block':>5}  {'tokens':<13} {'hash':<{HASH_CHARS}}  {'hit?':<4}  {'cause':<{width}} why",
    ]
    for run in ([[b] for b in e["blocks"]] if all_blocks else _runs(e["blocks"])):
        b, last = run[0], run[-1]
        group = f" g{b['group']}" if b["group"] else ""
        texts = [why(x, e["namespace"], e["prompt_logprobs"], tier) for x in run]
        text = texts[0] + (" (the first block's; --blocks all shows each)" if len(set(texts)) > 1 else "")
        label = str(b["block"]) if len(run) == 1 else f"{b['block']}-{last['block']}"
        digest = (b["hash"] or "-") if len(run) == 1 else f"{len(run)} blocks"
        lines.append(f"{label:>5}  {str(b['start']) + '-' + str(last['end']):<13} {digest:<{HASH_CHARS}}  "
                     f"{'hit' if b['hit'] else 'miss':<4}  {b['cause'] + group:<{width}} {text}".rstrip())
    return "\n".join([*lines, "", textwrap.fill(VOCABULARY, 100)])


def top_requests(run_dir: Path, n: int, router: str | None = None) -> dict[str, Any]:
    """The ``n`` requests of the run at ``run_dir`` that missed the most prompt tokens at their first
    admission, each with its main cause (the largest ``miss_<cause>_tokens``; needs a run with
    ``replay.attribution`` summary or full, else the cause is unknown); ``router`` as in :func:`explain`."""
    reqs = _router_tables(run_dir, router)[0]
    if "status" in reqs.columns:
        reqs = reqs[reqs["status"].astype(str) != "rejected"]
    ext = reqs["external_hit_tokens"] if "external_hit_tokens" in reqs.columns else 0
    missed = reqs["prompt_tokens"] - reqs["hit_tokens"] - ext
    cols = [c for c in table_causes(list(reqs.columns)) if f"miss_{c}_tokens" in reqs.columns]
    order = missed.sort_values(ascending=False, kind="stable").index[:n]
    rows = []
    for i in order:
        r = reqs.loc[i]
        counts = {c: int(r[f"miss_{c}_tokens"]) for c in cols}
        main = max(counts, key=lambda c: counts[c]) if counts and max(counts.values()) > 0 else None
        rows.append({"request_id": str(r["request_id"]), "prompt_tokens": int(r["prompt_tokens"]),
                     "hit_tokens": int(r["hit_tokens"]), "missed_tokens": int(missed.loc[i]),
                     "main_cause": main, "main_cause_tokens": counts.get(main, 0) if main else None})
    return {"num_requests": len(reqs), "attribution": bool(cols), "requests": rows}


def render_top(t: dict[str, Any]) -> str:
    """``apcsim explain RUN --top N``'s text: one line per request, most missed first."""
    lines = [f"the {len(t['requests'])} of {t['num_requests']:,} requests that missed the most prompt tokens"
             + ("" if t["attribution"] else " (no causes: run with --set replay.attribution=summary)"),
             f"{'request':<20} {'prompt':>8} {'hit':>8} {'missed':>8}  main cause"]
    for r in t["requests"]:
        cause = f"{r['main_cause']} ({r['main_cause_tokens']:,} tokens)" if r["main_cause"] else "-"
        lines.append(f"{r['request_id']:<20} {r['prompt_tokens']:>8,} {r['hit_tokens']:>8,} "
                     f"{r['missed_tokens']:>8,}  {cause}")
    if t["attribution"]:
        lines += ["", textwrap.fill(VOCABULARY, 100)]
    return "\n".join(lines)

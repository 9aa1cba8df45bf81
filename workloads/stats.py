"""The shape of a workload, without replaying it (what ``apcsim workloads stats`` prints).

Mirrors nothing in vLLM: it summarises a request stream. Prints requests, prompt / output tokens,
sessions, tenants, salts, LoRA adapters, prompt-logprobs requests, the arrival span, the
infinite-cache hit bound (``workloads.bounds``) at each block size asked for, the note that
results at block sizes finer than the trace's own are lower bounds, skipped bad lines, and source
facts: the Mooncake id-level bound of the whole file (the published 0.366 / 0.640) and the
coding-agent trace statistics the agent generator's defaults come from.

Invariants: streams the workload once (each prompt is expanded, hashed and dropped; memory is the
hash set). Takes a built :class:`~workloads.registry.Workload` and the ``workload:`` section, never
an experiment config (``sim.experiment.workload`` builds both). Imports sim.core only.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sim.core.request import token_array
from workloads.bounds import HitBound
from workloads.paths import input_path, shared_traces_dir
from workloads.registry import Workload
from workloads.schema import WorkloadConfig


def workload_stats(wl: Workload, block_sizes: Sequence[int], facts: dict[str, Any] | None = None) -> dict[str, Any]:
    """Statistics of the stream ``wl`` as a JSON-able dict, the bound at each of ``block_sizes``;
    ``facts`` (:func:`source_facts`) are stored under ``source_facts`` when given."""
    bounds = [HitBound(bs) for bs in block_sizes]
    n = prompt = output = max_prompt = plp = 0
    sessions: set[str] = set()
    tenants: set[str] = set()
    salts: set[str] = set()
    loras: set[str] = set()
    first = last = 0.0
    for req in wl.requests:
        tokens = token_array(req.tokens)
        for b in bounds:
            b.add(req, tokens)
        if n == 0:
            first = req.arrival
        n += 1
        prompt += tokens.size
        max_prompt = max(max_prompt, int(tokens.size))
        output += req.output_tokens
        plp += bool(req.prompt_logprobs)
        sessions.add(req.session if req.session is not None else req.id)
        for bag, v in ((tenants, req.tenant), (salts, req.salt), (loras, req.lora)):
            if v is not None:
                bag.add(v)
        last = req.arrival
    out: dict[str, Any] = {
        "workload": wl.description,
        "requests": n,
        "prompt_tokens": prompt,
        "output_tokens": output,
        "mean_prompt_tokens": prompt / n if n else 0.0,
        "max_prompt_tokens": max_prompt,
        "sessions": len(sessions),
        "tenants": len(tenants),
        "distinct_salts": len(salts),
        "lora_adapters": len(loras),
        "prompt_logprobs_requests": plp,
        "arrival_span_s": (last - first) if n else 0.0,
        "hit_bound": {b.block_size: b.value for b in bounds},
        "notes": list(wl.notes),
    }
    native = wl.native_block_size
    if native is not None and any(bs < native for bs in block_sizes):
        out["notes"].append(f"bounds at block sizes < {native} are lower bounds on the real workload")
    if wl.reader is not None:
        out["skipped_bad_lines"] = wl.reader.skipped
    clamped = getattr(wl.source, "clamped_outputs", 0)
    if clamped:
        out["notes"].append(f"{clamped} request(s) with 0 output tokens replayed with 1")
    if facts is not None:
        out["source_facts"] = facts
    return out


def source_facts(w: WorkloadConfig, base_dir: str | Path = ".") -> dict[str, Any]:
    """Facts of the whole source file behind ``w`` (Mooncake, coding-agent traces; else empty)."""
    if w.kind == "mooncake":
        from workloads.mooncake import mooncake_stats

        path = input_path(w.path, base_dir) if w.path else shared_traces_dir() / "mooncake" / "conversation_trace.jsonl"
        s = mooncake_stats(path, tokens_per_id=w.tokens_per_id)
        return {"whole_file_id_level_block_hit_bound": s["block_hit_bound"], "whole_file_requests": s["requests"]}
    if w.kind == "agent_trace":
        from workloads.agent_stats import agent_trace_statistics

        folder = input_path(w.path, base_dir) if w.path else shared_traces_dir() / "weka_agent_sample"
        return agent_trace_statistics(folder)
    return {}


def format_stats(s: dict[str, Any]) -> str:
    """Human-readable lines."""
    lines = [f"workload: {s['workload']}"]
    for key in ("requests", "prompt_tokens", "output_tokens", "mean_prompt_tokens", "max_prompt_tokens",
                "sessions", "tenants", "distinct_salts", "lora_adapters", "prompt_logprobs_requests",
                "arrival_span_s", "skipped_bad_lines"):
        if key in s:
            v = s[key]
            lines.append(f"  {key:<26} {v:,.1f}" if isinstance(v, float) else f"  {key:<26} {v:,}")
    lines.append("  infinite-cache hit bound  " + "  ".join(f"bs {bs}: {v:.4f}" for bs, v in s["hit_bound"].items()))
    lines += [f"  note: {note}" for note in s["notes"]]
    facts = s.get("source_facts") or {}
    if "whole_file_id_level_block_hit_bound" in facts:
        bound = facts["whole_file_id_level_block_hit_bound"]
        lines.append(f"  trace fact: id-level block-hit bound of the whole file "
                     f"({facts['whole_file_requests']:,} requests) = {bound:.4f}")
    elif facts:
        from workloads.agent_stats import format_statistics

        lines.append("  coding-agent trace statistics (the agent generator's defaults):")
        lines += ["    " + line for line in format_statistics(facts).splitlines()]
    return "\n".join(lines)

"""``apcsim workloads stats CONFIG``: the shape of a config's workload, without replaying it.

Prints requests, prompt / output tokens, sessions, tenants, salts, LoRA adapters,
prompt-logprobs requests, the arrival span, the infinite-cache hit bound (``workloads.bounds``) at
the config's ``engine.block_size`` or at every ``--block-size`` given, the note that results at
block sizes finer than the trace's own are lower bounds, skipped bad lines, and source facts:
the Mooncake id-level bound of the whole file (the published 0.366 / 0.640) and the coding-agent
trace statistics the agent generator's defaults come from. Streams the workload once (each prompt
is expanded, hashed and dropped; memory is the hash set).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from workloads.bounds import HitBound
from workloads.registry import Workload, build_workload
from workloads.trace_format import TraceRequest


def workload_stats(cfg: Any, block_sizes: list[int] | None = None, *, facts: bool = True) -> dict[str, Any]:
    """Statistics of ``cfg``'s workload (an ``ExperimentConfig``) as a JSON-able dict."""
    sizes = block_sizes or [cfg.engine.block_size]
    wl: Workload = build_workload(cfg)
    bounds = [HitBound(bs) for bs in sizes]
    n = prompt = output = max_prompt = plp = 0
    sessions: set[str] = set()
    tenants: set[str] = set()
    salts: set[str] = set()
    loras: set[str] = set()
    first = last = None
    from sim.core.request import token_array

    for req in wl.requests:
        req_: TraceRequest = req
        tokens = token_array(req_.tokens)
        for b in bounds:
            b.add(req_, tokens)
        n += 1
        prompt += tokens.size
        max_prompt = max(max_prompt, int(tokens.size))
        output += req_.output_tokens
        plp += bool(req_.prompt_logprobs)
        sessions.add(req_.session if req_.session is not None else req_.id)
        for bag, v in ((tenants, req_.tenant), (salts, req_.salt), (loras, req_.lora)):
            if v is not None:
                bag.add(v)
        first = req_.arrival if first is None else first
        last = req_.arrival
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
        "arrival_span_s": (last - first) if n else 0.0,  # type: ignore[operator]
        "hit_bound": {b.block_size: b.value for b in bounds},
        "notes": list(wl.notes),
    }
    native = wl.native_block_size
    if native is not None and any(bs < native for bs in sizes):
        out["notes"].append(f"bounds at block sizes < {native} are lower bounds on the real workload")
    if wl.reader is not None:
        out["skipped_bad_lines"] = wl.reader.skipped
    clamped = getattr(wl.source, "clamped_outputs", 0)
    if clamped:
        out["notes"].append(f"{clamped} request(s) with 0 output tokens replayed with 1")
    if facts:
        out["source_facts"] = _facts(cfg)
    return out


def _facts(cfg: Any) -> dict[str, Any]:
    w = cfg.workload
    from workloads.paths import shared_traces_dir

    if w.kind == "mooncake":
        from workloads.mooncake import mooncake_stats

        path = cfg.resolve_path(w.path) if w.path else shared_traces_dir() / "mooncake" / "conversation_trace.jsonl"
        s = mooncake_stats(path, tokens_per_id=w.tokens_per_id)
        return {"whole_file_id_level_block_hit_bound": s["block_hit_bound"], "whole_file_requests": s["requests"]}
    if w.kind == "agent_trace":
        from workloads.agent_stats import agent_trace_statistics

        folder = cfg.resolve_path(w.path) if w.path else shared_traces_dir() / "weka_agent_sample"
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
        lines.append(f"  trace fact: id-level block-hit bound of the whole file "
                     f"({facts['whole_file_requests']:,} requests) = {facts['whole_file_id_level_block_hit_bound']:.4f}")
    elif facts:
        from workloads.agent_stats import format_statistics

        lines.append("  coding-agent trace statistics (the agent generator's defaults):")
        lines += ["    " + line for line in format_statistics(facts).splitlines()]
    return "\n".join(lines)


def _cmd_stats(args: argparse.Namespace) -> int:
    from sim.experiment.config import load_config

    cfg = load_config(args.config, args.set)
    sizes = [int(x) for item in args.block_size for x in str(item).split(",") if x.strip()] or None
    s = workload_stats(cfg, sizes)
    print(json.dumps(s, indent=2, default=str) if args.json else format_stats(s))
    return 0


def add_workloads_parser(sub: Any) -> None:
    """Register ``apcsim workloads stats`` on the CLI's sub-parsers."""
    wl = sub.add_parser("workloads", help="inspect workloads")
    wsub = wl.add_subparsers(dest="workloads_command", required=True)
    st = wsub.add_parser("stats", help="print a config's workload shape and infinite-cache hit bound")
    st.add_argument("config", type=Path, help="experiment YAML file")
    st.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config key")
    st.add_argument("--block-size", action="append", default=[], metavar="N[,N...]",
                    help="block size(s) for the bound (default: engine.block_size); repeatable or comma-separated")
    st.add_argument("--json", action="store_true", help="print JSON")
    st.set_defaults(func=_cmd_stats)

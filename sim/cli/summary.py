"""The human summary ``apcsim run`` prints: an aligned plain-text table of one run's summary.

Mirrors nothing in vLLM. Shows the workload (requests, tokens), the pool (blocks, tokens, GiB),
the three hit rates -- first-admission beside the offline references that count requests the same
way, vLLM's ``prefix_cache_hit_rate`` (named with the summary's ``vllm_version`` and read with its
semantics: 0.25.1 counts every lookup, 0.33.0 each admission), the share of requests with a hit --, evictions and
preemptions, TTFT / TPOT / queue time / E2E percentiles at 3 significant figures, throughput and
the diagnosis of ``sim.analysis.diagnosis``.

Invariants: renders only values present in the summary (a missing or NaN figure prints ``n/a``),
never computes a metric. Imports nothing beyond the standard library and the diagnosis.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Mapping
from typing import Any, TypeGuard

from sim.analysis.diagnosis import VOCABULARY, diagnose

_LATENCIES = (("TTFT", "ttft"), ("TPOT", "tpot"), ("queue time", "queue_time"), ("E2E", "e2e"))


def _ok(x: Any) -> TypeGuard[float]:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def sig(x: Any, digits: int = 3) -> str:
    """``x`` to ``digits`` significant figures, without exponent for everyday magnitudes."""
    if not _ok(x):
        return "n/a"
    if x == 0:
        return "0"
    mag = math.floor(math.log10(abs(x)))
    if abs(x) >= 1e9:  # 3000000000 reads as a run of digits: 3.00e+09
        return f"{x:.{digits - 1}e}"
    if mag >= digits - 1:
        return f"{round(x, digits - 1 - mag):,.0f}"
    if mag < -4:
        return f"{x:.{digits - 1}e}"
    return f"{x:.{max(0, digits - 1 - mag)}f}"


def seconds(x: Any) -> str:
    """A duration at 3 significant figures: s from 1 s, ms from 0.1 ms, us from 1 us, ns from 0.1 ns;
    below that (a step time of 1e-300 s) in seconds with an exponent, never a run of zeros."""
    if not _ok(x):
        return "n/a"
    a = abs(x)
    if a == 0 or a >= 1:
        return f"{sig(x)} s"
    for scale, unit, least in ((1e3, "ms", 0.1), (1e6, "us", 1.0), (1e9, "ns", 0.1)):
        if a * scale >= least:
            return f"{sig(x * scale)} {unit}"
    return f"{x:.2e} s"


def count(x: Any) -> str:
    """A count: exact with separators below 10,000, else 3 significant figures with k / M / G."""
    if not _ok(x):
        return "n/a"
    for div, unit in ((1e9, " G"), (1e6, " M"), (1e3, " k")):
        if abs(x) >= 10_000 and abs(x) >= div:
            return f"{sig(x / div)}{unit}"
    return f"{int(x):,}"


def exact(x: Any) -> str:
    """A count with thousands separators."""
    return f"{int(x):,}" if _ok(x) else "n/a"


def _row(label: str, *cells: str, width: int = 38) -> str:
    return f"  {label:<{width}}" + "  ".join(cells)


def _pool(s: Mapping[str, Any]) -> str:
    e = s.get("engine") or {}
    if not e:
        return "n/a"
    gib = e.get("kv_pool_gib")
    text = (f"{exact(e['num_gpu_blocks'])} blocks x {e['block_size']} tokens = {count(e['capacity_tokens'])} "
            f"tokens" + (f" ({sig(gib)} GiB)" if _ok(gib) else ""))
    groups = e.get("num_kv_groups", 1)
    fleet = (s.get("cluster") or {}).get("num_replicas")
    text += f" per replica x {fleet} replicas" if fleet else ""
    return text + (f", {groups} KV-cache groups" if groups and groups > 1 else "") + (
        f"; {e['model']} on {e['gpu']}, max_model_len {exact(e['max_model_len'])}")


_REFERENCES = (
    ("infinite_cache_hit_rate", "infinite cache", "upper bound: nothing is ever evicted"),
    ("belady_hit_rate", "Belady, this pool", "optimal eviction, requests one at a time"),
    ("lru_sequential_hit_rate", "vLLM's LRU, this pool", "requests one at a time (no concurrency)"),
)


def _router_note(s: Mapping[str, Any]) -> str:
    """``; the fleet under the sglang router`` in a cluster run (whose hit-rate and latency lines are the
    primary router's replay; the routers compared are in :func:`render_routers`), else empty."""
    kind = ((s.get("cluster") or {}).get("router") or {}).get("kind")
    return f"; the fleet under the {kind} router" if kind else ""


def _hit_rates(s: Mapping[str, Any]) -> list[str]:
    frac = s.get("requests_with_hit_fraction")
    lines = [f"hit rate    (fractions of prompt tokens{_router_note(s)})",
             _row("first admission (each request once)", f"{sig(s.get('first_admission_token_hit_rate')):<7}",
                  "first_admission_token_hit_rate")]
    if "infinite_cache_hit_rate" not in s:
        lines.append(_row("  (no bounds: they model one engine, not a routed fleet)" if "cluster" in s
                          else "  (no bounds: run without --no-bounds)"))
    for key, label, note in _REFERENCES:
        if key in s:
            if "cluster" in s:  # sim.experiment.bounds.fleet_references
                label, note = "infinite cache, one for the fleet", "upper bound for any router: shared, never evicted"
            lines.append(_row(f"  {label}", f"{sig(s.get(key)):<7}", note))
    away = (s.get("miss_attribution") or {}).get("routed_away") if "cluster" in s else None
    if _ok(away):  # replay.attribution on a fleet (sim.cluster.fleet_attribution)
        lost = away / s["prompt_tokens"] if s.get("prompt_tokens") else 0.0
        lines.append(_row("  lost to routing (routed_away)", f"{sig(lost):<7}",
                          f"{count(away)} prompt tokens resident on another replica when routed"))
    pc = s.get("prefix_cache") or {}
    version = s.get("vllm_version") or (s.get("engine") or {}).get("vllm_version")
    if version is not None and version != "0.25.1":  # 0.33: recorded once per admission
        note = (f"each admission: {count(pc.get('queries'))} prompt tokens of first admissions, "
                f"{count(pc.get('preempted_queries'))} of re-admissions (preempted_*)")
    else:  # 0.25.1 (and summaries written before versions): every lookup of a waiting head
        note = (f"every lookup: {count(pc.get('queries'))} tokens looked up for "
                f"{count(s.get('prompt_tokens'))} prompt tokens")
    lines += [
        _row(f"vLLM {version or ''} prefix_cache_hit_rate".replace("  ", " "),
             f"{sig(s.get('prefix_cache_hit_rate')):<7}", note),
        _row("requests with >= 1 hit token", f"{(sig(100 * frac) + ' %') if _ok(frac) else 'n/a':<7}",
             f"{exact(s.get('num_requests_with_hit'))} of {exact(s.get('num_requests'))} requests"),
    ]
    return lines + _tiers(s)


_TWO_TIER_REFERENCES = (
    ("two_tier_infinite", "two tiers, infinite", "upper bound: neither tier evicts"),
    ("two_tier_lru_sequential", "two tiers, this pool + tier (LRU)", "requests one at a time (no concurrency)"),
    ("two_tier_arc_sequential", "two tiers, this pool + tier (ARC)", "requests one at a time (no concurrency)"),
)


def _tiers(s: Mapping[str, Any]) -> list[str]:
    """A hit-rate line per tier of a run with a CPU offload tier (``sim.replay.tier_metrics``):
    vLLM 0.33.0's ``prompt_tokens_by_source`` of first admissions, the tier's counters, and the
    two-tier references (``workloads.tier_bounds``) by source; nothing without a tier."""
    by_source = s.get("hit_rate_by_source")
    if not by_source:
        return []
    pts = s.get("prompt_tokens_by_source") or {}
    ext = s.get("external_prefix_cache") or {}
    if "kv_store" in s:  # a fleet's shared store is its replicas' tier (sim.cluster.kv_store_summary)
        return _store_lines(s["kv_store"], by_source, pts, ext)
    cpu = s.get("cpu_tier") or {}
    size = (s.get("engine") or {}).get("cpu_tier") or {}
    lines = [
        "by tier     (prompt tokens of first admissions: vLLM 0.33.0 prompt_tokens_by_source)",
        _row("GPU prefix cache (local_cache_hit)", f"{sig(by_source.get('gpu')):<7}",
             f"{count(pts.get('local_cache_hit'))} tokens"),
        _row("CPU tier (external_kv_transfer)", f"{sig(by_source.get('cpu')):<7}",
             f"{count(pts.get('external_kv_transfer'))} tokens loaded; the connector found "
             f"{sig(ext.get('hit_rate'))} of the {count(ext.get('queries'))} tokens the GPU missed"),
    ]
    for key, label, note in _TWO_TIER_REFERENCES:
        if _ok(s.get(f"{key}_hit_rate")):
            lines.append(_row(f"  {label}", f"{sig(s.get(f'{key}_hit_rate')):<7}",
                              f"GPU {sig(s.get(f'{key}_gpu_hit_rate'))} + CPU {sig(s.get(f'{key}_cpu_hit_rate'))}; "
                              + note))
    fleet = "cluster" in s  # a fleet's counters and chunks are its replicas' summed (sim.cluster.cluster_tier)
    lines.append(
        (f"cpu tier    {exact(cpu.get('num_chunks'))} chunks in the fleet" if fleet else
         f"cpu tier    {exact(size.get('num_chunks', cpu.get('num_chunks')))} chunks")
        + (f" ({sig(size['gib'])} GiB, {size['policy'].upper()}, link {sig(size['link_gb_s'])} GB/s "
           f"{'per direction' if size.get('link_duplex', True) else 'shared by loads and stores'})"
           if size and not fleet else "")
        + f": {exact(cpu.get('chunks_stored'))} stored, {exact(cpu.get('chunks_loaded'))} loaded, "
        f"{exact(cpu.get('chunks_evicted'))} evicted, {exact(cpu.get('allocation_failures'))} allocation failures")
    return lines


def _store_lines(kv: Mapping[str, Any], by_source: Mapping[str, Any], pts: Mapping[str, Any],
                 ext: Mapping[str, Any]) -> list[str]:
    """:func:`_tiers` of a fleet with a shared KV store: its hit source ``remote`` and its counters."""
    return [
        "by tier     (prompt tokens of first admissions: vLLM 0.33.0 prompt_tokens_by_source)",
        _row("GPU prefix cache (local_cache_hit)", f"{sig(by_source.get('gpu')):<7}",
             f"{count(pts.get('local_cache_hit'))} tokens"),
        _row("KV store (external_kv_transfer)", f"{sig(by_source.get('remote')):<7}",
             f"{count(pts.get('external_kv_transfer'))} tokens loaded; the connectors found "
             f"{sig(ext.get('hit_rate'))} of the {count(ext.get('queries'))} tokens the GPUs missed"),
        f"kv store    {exact(kv.get('num_blocks'))} blocks ({str(kv.get('policy')).upper()}, per replica "
        f"{sig(kv.get('read_gb_s'))} GB/s read, {sig(kv.get('write_gb_s'))} GB/s write): "
        f"{exact(kv.get('blocks_stored'))} stored, {exact(kv.get('blocks_loaded'))} loaded, "
        f"{exact(kv.get('blocks_evicted'))} evicted",
    ]


_TIER_LABELS = {"evicted": "evicted from both tiers", "cpu_partial_chunk": "CPU partial chunk"}
"""The causes named for what they mean with a CPU offload tier (``sim.replay.attribution_tier``)."""


def _losses(loss: Mapping[str, float], tiered: bool = False) -> str:
    if "cold" in loss:  # the engine's miss attribution (sim.replay.attribution): every cause it counted
        def label(k: str) -> str:
            return _TIER_LABELS.get(k, k.replace("_", " ")) if tiered else k.replace("_", " ")

        return "missed prompt tokens by cause: " + ", ".join(
            f"{label(k)} {sig(v)}" for k, v in sorted(loss.items(), key=lambda kv: -kv[1]) if v)
    names = (("capacity", "capacity"), ("overload", "overload"), ("isolation", "isolation"),
             ("block_granularity", "block granularity"))
    shown = [f"{label} {sig(loss[k]) if _ok(loss.get(k)) else 'n/a'}" for k, label in names if k in loss]
    tail = f"; never repeated {sig(loss['workload'])}" if _ok(loss.get("workload")) else ""
    return "missed prompt tokens by cause: " + ", ".join(shown) + tail


def _routing(s: Mapping[str, Any]) -> str | None:
    """The diagnosis of a routed fleet: its hit rate against the fleet-wide infinite cache and the
    other routers replayed on the same fleet and stream (``cluster.compare``)."""
    c, inf = s["cluster"], s.get("infinite_cache_hit_rate")
    if not _ok(inf):
        return None
    kind = (c.get("router") or {}).get("kind", "the")
    others = [f"{r['router']} {sig(r['request_hit_rate'])}" for r in c.get("comparison") or [] if r["router"] != kind]
    return (f"routing -- on {c.get('num_replicas')} replicas the {kind} router reaches "
            f"{sig(s.get('first_admission_token_hit_rate'))} of the {sig(inf)} that one infinite cache shared by "
            f"the fleet would give" + (f" ({', '.join(others)} on the same fleet and stream)" if others else "")
            + ": a request hits only on the replica it is sent to, so the router decides which prefixes it can "
            "reach; the rest is lost to evictions within a replica and to turns sent away from their prefix"
            + (f" ({sig(away / s['prompt_tokens'])} of the prompt tokens were resident on another replica when "
               "routed: routed_away)" if _ok(away := (s.get("miss_attribution") or {}).get("routed_away"))
               and s.get("prompt_tokens") else ""))


def _left_out(s: Mapping[str, Any]) -> str:
    """What the run did not serve in full: rejected requests, outputs cut at max_model_len and skipped
    trace lines, when there are any."""
    parts = [f"{exact(v)} {what}" for key, what in (("num_rejected_requests", "rejected (see reject_reason)"),
                                                  ("num_length_capped_requests",
                                                   "outputs cut at max_model_len (finish_reason length_capped)"),
                                                  ("skipped_bad_lines", "trace lines skipped"))
             if _ok(v := s.get(key)) and v > 0]
    return "; " + ", ".join(parts) if parts else ""


def render(s: Mapping[str, Any], *, name: str, folder: str, wall_time_s: float,
           bounds_wall_time_s: float | None = None, width: int = 100) -> str:
    """The summary of one run as aligned lines (see the module docstring)."""
    n = s.get("num_requests", 0)
    prompt, outputs = s.get("prompt_tokens", 0), s.get("output_tokens", 0)
    mean_prompt = prompt / n if n else math.nan
    wall = f"{sig(wall_time_s)} s wall" + (f" (+ {sig(bounds_wall_time_s)} s for the bounds)"
                                          if bounds_wall_time_s is not None else "")
    lines = [
        f"{name}: {exact(n)} requests replayed in {wall}; {seconds(s.get('sim_time_s'))} simulated -> {folder}/",
        "",
        f"workload    {exact(n)} requests; {count(prompt)} prompt tokens (mean {count(mean_prompt)}), "
        f"{count(outputs)} output tokens" + _left_out(s),
        *(f"note        {note}" for note in s.get("workload_notes", ())),  # e.g. APPROXIMATE tokens
        f"pool        {_pool(s)}",
        "",
        *_hit_rates(s),
        f"cache       {exact(s.get('num_evictions'))} evictions, {exact(s.get('num_preemptions'))} preemptions",
        "",
        "latency" + " " * 9 + "".join(f"{h:>10}" for h in ("p50", "p90", "p99", "mean"))
        + (f"    ({_router_note(s)[2:]})" if _router_note(s) else ""),
    ]
    for label, key in _LATENCIES:
        cells = [seconds(s.get(f"{key}_p{q}_s")) for q in (50, 90, 99)] + [seconds(s.get(f"{key}_mean_s"))]
        lines.append(f"  {label:<14}" + "".join(f" {c:>9}" for c in cells))  # a space even when a cell is wide
    lines.append(f"throughput  {sig(s.get('throughput_requests_per_s'))} requests/s, "
                 f"{sig(s.get('throughput_output_tokens_per_s'))} output tokens/s "
                 f"(mean batch {sig(s.get('mean_batch_size'))} requests)")
    pools = (s.get("cluster") or {}).get("disaggregation")
    if pools:  # cluster.disaggregation (sim.cluster.disagg_summary): load by pool and the KV reads
        pre, dec, tr = pools["prefill"], pools["decode"], pools["transfers"]
        reads = (f"{exact(tr['count'])} KV reads, {sig(tr['bytes'] / 1e9)} GB, mean {seconds(tr['transfer_s_mean'])}, "
                 f"wait for decode blocks p90 {seconds(tr['kv_wait_s_p90'])}")
        lines.append(f"pools       {pre['replicas']} prefill (compute {seconds(pre['compute_s'])}, "
                     f"{count(pre['computed_tokens'])} prompt tokens computed) + {dec['replicas']} decode "
                     f"(compute {seconds(dec['compute_s'])}); {reads}")
    wrap = textwrap.TextWrapper(width=width, initial_indent="diagnosis   ", subsequent_indent=" " * 12)
    if "cluster" in s:  # the one-engine diagnosis reads pool bounds; a fleet's names its routing
        line = _routing(s)
        return "\n".join(lines + (["", *wrap.wrap(line)] if line else []))
    d = diagnose(s)
    lines += ["", *wrap.wrap(d.line)]
    if d.losses and d.cause not in ("caching_off", "unknown"):
        wrap.initial_indent = " " * 12
        lines += wrap.wrap(_losses(d.losses, tiered="hit_rate_by_source" in s))
        lines += wrap.wrap(VOCABULARY)  # the one mapping to apcsim explain's causes, also printed there
    return "\n".join(lines)


def render_routers(s: Mapping[str, Any]) -> list[str]:
    """The routers replayed on the same fleet and stream (``cluster.comparison``), the primary
    first: first-admission hit rate, TTFT p50 / p90 / p99 in the latency table's units, and the
    goodput under the run's TTFT SLO, named in the header; nothing without a comparison."""
    c = s.get("cluster") or {}
    rows = c.get("comparison") or []
    if not rows:
        return []
    slo = c.get("ttft_slo_s")
    lost = all("routed_away_fraction" in row for row in rows)  # replay.attribution on: lost to routing
    lines = [f"routers     on the same fleet and stream; hit rate: first admission; goodput: TTFT <= {seconds(slo)}"
             + ("; lost: to routing (routed_away)" if lost else ""),
             f"  {'router':<22}" + "".join(f"{h:>10}" for h in ("hit rate", "TTFT p50", "TTFT p90", "TTFT p99"))
             + f"{'goodput':>10}" + (f"{'lost':>10}" if lost else "")]
    for row in rows:
        cells = [sig(row.get("request_hit_rate"))] + [seconds(row.get(f"ttft_p{q}_s")) for q in (50, 90, 99)]
        good = row.get("goodput_fraction")
        lines.append(f"  {row['router']:<22}" + "".join(f"{x:>10}" for x in cells)
                     + f"{(sig(100 * good) + ' %') if _ok(good) else 'n/a':>10}"
                     + (f"{sig(row['routed_away_fraction']):>10}" if lost else ""))
    return lines

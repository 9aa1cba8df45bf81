"""What limited a run's hit rate: one cause and one sentence, from its summary alone.

Mirrors nothing in vLLM. The hit rate compared is ``first_admission_token_hit_rate`` (each request
counted once, as the offline references of ``sim.experiment.bounds`` count it). The prompt tokens
it misses split into losses, each a fraction of prompt tokens, read from the summary's references:

* ``workload`` -- ``1 - max(infinite_cache_hit_rate, ..._shared, ..._block_16)``: tokens that
  repeat no earlier prefix even in an infinite, shared cache with small blocks;
* ``isolation`` -- ``infinite_cache_hit_rate_shared - infinite_cache_hit_rate``: what the cache
  salts and LoRA adapters keep apart;
* ``block_granularity`` -- ``infinite_cache_hit_rate_block_16 - infinite_cache_hit_rate``: what
  blocks larger than 16 tokens lose to the partial block at the end of each shared prefix;
* ``capacity`` and ``overload`` split the engine's own gap ``infinite - hit rate`` at the
  sequential LRU reference (``lru_sequential_hit_rate``: vLLM's eviction order in this pool, one
  request at a time): ``overload = lru_sequential - hit rate`` (clamped to the gap) is what
  running requests at once costs -- their blocks fill the pool and a prefix is not cached before
  its first request is scheduled to compute it --, ``capacity`` the rest (the pool evicts prefixes before they are
  reused; Belady tells how much of it a better eviction order could win). Without the LRU
  reference (sliding-window or hybrid pools) the whole gap is ``capacity`` when blocks were evicted,
  else ``overload``.

:func:`diagnose` names the largest loss of capacity, overload, isolation and block granularity,
or ``workload`` when none of them reaches :data:`SIGNIFICANT` of the prompt tokens. When the
summary carries a ``miss_attribution`` mapping (cause -> missed prompt tokens, counted by the
engine), the cause is read from it instead and the references only explain.

Invariants: a pure function of the summary mapping (``summary.json`` of ``apcsim run``, or a sweep
row); a reference that is absent or NaN is never guessed. Imports nothing but the standard library.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

SIGNIFICANT = 0.02
"""A loss below this fraction of prompt tokens does not count as the limit (then: ``workload``)."""

CAUSES = ("capacity", "overload", "isolation", "block_granularity", "workload", "caching_off", "unknown")
"""The causes :func:`diagnose` names from the references (an engine miss attribution may name others)."""


VOCABULARY = ("the diagnosis's losses in apcsim explain's causes: capacity ~ evicted (a pool one request at "
              "a time loses these too), overload ~ in_flight + the evictions concurrency adds, isolation = "
              "isolation_salt/lora/mm, block granularity ~ partial_block, never repeated (workload) ~ cold")
"""The one mapping between the two vocabularies, printed by the run's summary and by ``apcsim
explain``: the diagnosis splits the missed tokens by offline references (what a pool, one request at a
time, an unsalted cache or 16-token blocks would have hit), the engine's attribution by what each
missed block met at its lookup (``sim.replay.attribution``); the names pair up as stated, the counts
only approximately (the references replay a simpler model of the engine)."""


@dataclass(frozen=True)
class Diagnosis:
    """``cause`` (one of :data:`CAUSES`), the sentence saying why, and the losses behind it."""

    cause: str
    line: str
    losses: dict[str, float] = field(default_factory=dict)


def _num(s: Mapping[str, Any], key: str) -> float:
    v = s.get(key)
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else math.nan


def _engine(s: Mapping[str, Any], key: str) -> Any:
    eng = s.get("engine")
    return eng.get(key) if isinstance(eng, Mapping) and key in eng else s.get(key)


def _f(x: float) -> str:
    """3 significant figures, trailing zeros kept (``0.930``, ``17.1``, ``123``)."""
    return f"{x:#.3g}".rstrip(".") if math.isfinite(x) else "n/a"


def losses(s: Mapping[str, Any]) -> dict[str, float]:
    """The losses of the module docstring (NaN where a reference is missing)."""
    h = _num(s, "first_admission_token_hit_rate")
    h = h if math.isfinite(h) else _num(s, "request_hit_rate")
    inf = _num(s, "infinite_cache_hit_rate")
    shared = _num(s, "infinite_cache_hit_rate_shared")
    fine = _num(s, "infinite_cache_hit_rate_block_16")
    lru = _num(s, "lru_sequential_hit_rate")
    gap = max(0.0, inf - h)
    if math.isfinite(lru):
        overload = min(gap, max(0.0, lru - h))
    else:
        overload = 0.0 if _num(s, "num_evictions") > 0 else gap
    best = max((x for x in (inf, shared, fine) if math.isfinite(x)), default=math.nan)
    return {
        "capacity": gap - overload,
        "overload": overload,
        "isolation": max(0.0, shared - inf) if math.isfinite(shared) else math.nan,
        "block_granularity": max(0.0, fine - inf) if math.isfinite(fine) else 0.0,
        "workload": 1.0 - best,
    }


def _plural(n: int, noun: str) -> str:
    return "" if not n else f"{n} {noun}" if n == 1 else f"{n:,} {noun}s"


def _sentence(cause: str, s: Mapping[str, Any], loss: dict[str, float]) -> str:
    h = _num(s, "first_admission_token_hit_rate")
    inf, bel, lru = (_num(s, k) for k in ("infinite_cache_hit_rate", "belady_hit_rate", "lru_sequential_hit_rate"))
    if cause == "capacity":
        text = (f"capacity -- the pool evicts prefixes before they are reused ({int(_num(s, 'num_evictions')):,} "
                f"evictions): in this pool vLLM's LRU reaches {_f(lru)} even one request at a time, Belady's "
                f"optimal order {_f(bel)}, an infinite cache {_f(inf)}")
        if math.isfinite(bel) and math.isfinite(lru) and bel - lru >= SIGNIFICANT:
            text += "; a larger pool or a better eviction order would win"
        else:
            text += "; only a larger pool would win"
        return text
    if cause == "overload":
        return (f"overload -- requests run at once (queue time p50 {_f(_num(s, 'queue_time_p50_s'))} s, p99 "
                f"{_f(_num(s, 'queue_time_p99_s'))} s): their blocks fill the pool and a prefix is cached only "
                f"once its first request is scheduled; one request at a time this pool reaches {_f(lru)}, here "
                f"{_f(h)} -- lower the load (arrival rate) or add replicas")
    if cause == "isolation":
        n_salt, n_lora = (int(x) if math.isfinite(x) else 0 for x in (_num(s, "num_cache_salts"),
                                                                       _num(s, "num_lora_adapters")))
        who = " and ".join(p for p in (_plural(n_salt, "cache salt"), _plural(n_lora, "LoRA adapter")) if p)
        return (f"isolation -- {who or 'salts or adapters'} split the cache into namespaces that share nothing: "
                f"an infinite cache reaches {_f(inf)}, one shared namespace "
                f"{_f(_num(s, 'infinite_cache_hit_rate_shared'))}")
    if cause == "block_granularity":
        return (f"block granularity -- only full blocks of {_engine(s, 'block_size')} tokens hit, so the partial "
                f"block at the end of each shared prefix is recomputed: an infinite cache reaches {_f(inf)}, at "
                f"block size 16 {_f(_num(s, 'infinite_cache_hit_rate_block_16'))}")
    if cause == "caching_off":
        return "prefix caching is off (engine.enable_prefix_caching: false)"
    return (f"workload -- the hit rate {_f(h)} is near what the workload allows: "
            f"{_f(1 - loss['workload'])} of prompt tokens repeat an earlier prefix even in an infinite shared "
            f"cache")


def _from_attribution(s: Mapping[str, Any], attribution: Mapping[str, Any]) -> Diagnosis | None:
    prompt = _num(s, "prompt_tokens")
    counts = {str(k): float(v) for k, v in attribution.items() if isinstance(v, (int, float))}
    if not counts or not prompt > 0:
        return None
    cause, tokens = max(counts.items(), key=lambda kv: kv[1])
    loss = {k: v / prompt for k, v in counts.items()}
    return Diagnosis(cause, f"{cause} -- {100 * tokens / prompt:.1f} % of prompt tokens missed for this reason "
                            f"(the engine's miss attribution)", loss)


def diagnose(summary: Mapping[str, Any]) -> Diagnosis:
    """The cause that limited the hit rate (see the module docstring)."""
    if _engine(summary, "enable_prefix_caching") is False:
        return Diagnosis("caching_off", _sentence("caching_off", summary, {}), {})
    attribution = summary.get("miss_attribution")
    if isinstance(attribution, Mapping):
        found = _from_attribution(summary, attribution)
        if found is not None:
            return found
    loss = losses(summary)
    if not math.isfinite(_num(summary, "infinite_cache_hit_rate")):
        return Diagnosis("unknown", "no offline references in this summary (run without --no-bounds)", loss)
    ranked = sorted(((loss[c], c) for c in ("capacity", "overload", "isolation", "block_granularity")
                     if math.isfinite(loss[c])), reverse=True)
    cause = ranked[0][1] if ranked and ranked[0][0] >= SIGNIFICANT else "workload"
    return Diagnosis(cause, _sentence(cause, summary, loss), loss)

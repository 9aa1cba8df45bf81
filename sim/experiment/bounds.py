"""Offline reference hit rates of an experiment's own request stream, at its resolved engine.

Mirrors nothing in vLLM: the references of ``workloads.bounds`` (one request at a time in arrival
order, each counted once at its lookup, so they compare with the replay's
``first_admission_token_hit_rate``) computed over the stream the replay saw, at the scheduler
block size and pool of the point's :class:`~sim.experiment.engine_description.EngineDescription`.

* :func:`reference_hit_rates` -- ``infinite_cache_hit_rate`` always (also an upper bound for
  sliding-window and hybrid pools); ``belady_hit_rate`` and ``lru_sequential_hit_rate`` at capacity
  ``num_gpu_blocks - 1`` only when the pool holds one full-attention group, NaN otherwise (their
  model is one pool of equal blocks, which several groups competing for it, or a window freeing
  blocks, break). With a CPU offload tier (``engine.offload``) also the two-tier references of
  ``workloads.tier_bounds``, each with its GPU and CPU parts: ``two_tier_infinite_hit_rate``
  (``_gpu_hit_rate``, ``_cpu_hit_rate``: both tiers never evict) and
  ``two_tier_<policy>_sequential_hit_rate`` (with its parts; the sequential LRU GPU pool plus the
  CPU tier under its ``lru`` or ``arc`` policy; NaN without one full-attention group). Sweep rows and
  ``apcsim run``'s ``summary.json`` carry these.
* :func:`limit_references` -- what the diagnosis of ``apcsim run`` (``sim.analysis.diagnosis``)
  needs to tell isolation and block granularity apart from the workload:
  ``infinite_cache_hit_rate_shared`` (the infinite cache with every ``cache_salt`` and LoRA name
  dropped: one namespace for all requests; equal to ``infinite_cache_hit_rate`` when the stream has
  neither), ``infinite_cache_hit_rate_block_16`` (the infinite cache at block size 16, vLLM's
  default, present only when the engine's block size is larger) and the stream's
  ``num_cache_salts``, ``num_lora_adapters`` and ``num_prompt_logprobs_requests`` (such requests
  never read the cache).
* :func:`fleet_references` -- a routed fleet's (``cluster:``) one reference, the stream's
  ``infinite_cache_hit_rate`` (one shared cache: no router beats it); :func:`run_references` picks
  the fleet's or the one engine's for a config, for runs and sweep points alike.

Invariants: every reference is computed from the stream ``sim.experiment.workload.build_workload``
gives for ``(cfg, engine)``, the replay's own; the block reference string is cached per stream and
block size in the process (sweep points that differ only in pool size hash their stream once), with
the infinite-cache rate over it (it depends on no capacity).
Imports neither simpy nor torch.
"""

from __future__ import annotations

import dataclasses
import json
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from sim.core.request import token_array
from sim.experiment.config import ExperimentConfig
from sim.experiment.engine_description import EngineDescription
from sim.experiment.workload import build_workload, stream_key
from workloads.bounds import BlockReferences, HitBound, block_references, infinite_hit_rate, offline_bounds
from workloads.tier_bounds import tier_references
from workloads.trace_format import TraceRequest

FINE_BLOCK_SIZE = 16
"""The block size of the granularity reference (vLLM's default block size)."""

@dataclass
class _StreamFacts:
    """What the diagnosis references count over a stream, gathered while its blocks are hashed."""

    salts: set[str] = field(default_factory=set)
    loras: set[str] = field(default_factory=set)
    prompt_logprobs: int = 0

    def watch(self, stream: Iterable[TraceRequest]) -> Iterator[TraceRequest]:
        for req in stream:
            if req.salt is not None:
                self.salts.add(req.salt)
            if req.lora is not None:
                self.loras.add(req.lora)
            self.prompt_logprobs += bool(req.prompt_logprobs)
            yield req


_Entry = tuple[BlockReferences, dict[str, float], _StreamFacts]
_REFS_CACHE: OrderedDict[str, _Entry] = OrderedDict()
_REFS_CACHE_SIZE = 2


Shared = tuple[Iterable[TraceRequest], str]
"""A stream the caller holds already and the scope it was shared in
(``sim.experiment.workload.shared_workload``)."""


def _references(cfg: ExperimentConfig, engine: EngineDescription, shared: Shared | None = None) -> _Entry:
    """The stream's block reference string at the scheduler block size and the references computed
    over it so far, by capacity-free name (cached, see the docstring); ``shared``: the stream when
    the caller holds it (else it is built)."""
    scope = shared[1] if shared is not None else None
    ident = json.dumps({"stream": stream_key(cfg, scope), "block_size": engine.block_size}, sort_keys=True)
    entry = _REFS_CACHE.get(ident)
    if entry is None:
        stream = shared[0] if shared is not None else build_workload(cfg, engine).requests
        facts = _StreamFacts()
        entry = (block_references(facts.watch(stream), engine.block_size), {}, facts)
        _REFS_CACHE[ident] = entry
        while len(_REFS_CACHE) > _REFS_CACHE_SIZE:
            _REFS_CACHE.popitem(last=False)
    else:
        _REFS_CACHE.move_to_end(ident)
    return entry


def _infinite(entry: _Entry) -> float:
    """The stream's infinite-cache rate, computed once per cached reference string."""
    refs, known, _ = entry
    if "infinite_cache_hit_rate" not in known:
        known["infinite_cache_hit_rate"] = infinite_hit_rate(refs)
    return known["infinite_cache_hit_rate"]


def run_references(cfg: ExperimentConfig, engine: EngineDescription, shared: Shared | None = None) -> dict[str, float]:
    """The offline references of one run's stream, for the engine it runs on: a routed fleet's
    (:func:`fleet_references`, with a ``cluster:`` section) or one engine's
    (:func:`reference_hit_rates`). Runs and sweep points both ask here; ``shared``: the stream
    when the caller holds it (a sweep worker's, with its scope)."""
    if cfg.cluster is not None:
        return fleet_references(cfg, engine, shared)
    return reference_hit_rates(cfg, engine, shared)


def reference_hit_rates(cfg: ExperimentConfig, engine: EngineDescription,
                        shared: Shared | None = None) -> dict[str, float]:
    """``infinite_cache_hit_rate``, ``belady_hit_rate`` and ``lru_sequential_hit_rate`` and, with a
    CPU offload tier, the two-tier references (see the module docstring)."""
    capacity = max(0, engine.num_gpu_blocks - 1) if engine.single_full_group else None
    entry = _references(cfg, engine, shared)
    out = offline_bounds(entry[0], capacity, infinite=_infinite(entry))
    if engine.offload is not None:  # a CPU offload tier: the two-tier references too
        out.update(tier_references(entry[0], capacity, engine.offload))
    return out


def limit_references(cfg: ExperimentConfig, engine: EngineDescription, infinite: float) -> dict[str, Any]:
    """The diagnosis references (see the module docstring); ``infinite`` is the stream's
    ``infinite_cache_hit_rate``, reused where a reference provably equals it. The counts come
    from the pass that hashed the stream's blocks (:func:`run_references`); the stream is read
    again only for a shared-namespace or block-16 reference, each prompt expanded once."""
    facts = _references(cfg, engine)[2]
    salts, loras = facts.salts, facts.loras
    shared = HitBound(engine.block_size) if salts or loras else None
    fine = HitBound(FINE_BLOCK_SIZE) if engine.block_size > FINE_BLOCK_SIZE else None
    if shared is not None or fine is not None:
        for req in build_workload(cfg, engine).requests:
            tokens = token_array(req.tokens)
            if shared is not None:
                shared.add(dataclasses.replace(req, salt=None, lora=None), tokens)
            if fine is not None:
                fine.add(req, tokens)
    out: dict[str, Any] = {
        "infinite_cache_hit_rate_shared": shared.value if shared is not None else infinite,
        "num_cache_salts": len(salts),
        "num_lora_adapters": len(loras),
        "num_prompt_logprobs_requests": facts.prompt_logprobs,
    }
    if fine is not None:
        out[f"infinite_cache_hit_rate_block_{FINE_BLOCK_SIZE}"] = fine.value
    return out


_POOL_KEYS = frozenset({"block_size", "hash_block_size", "kv_cache_groups", "enable_prefix_caching", "hash_algo"})


def fleet_references(cfg: ExperimentConfig, engine: EngineDescription,
                     shared: Shared | None = None) -> dict[str, float]:
    """The reference of a routed fleet (``cluster:``): ``infinite_cache_hit_rate``, the stream's
    infinite-cache bound at the replicas' block size -- one cache that never evicts, shared by every
    replica. A request hits only on the replica it is routed to, so no router and no fleet size
    reaches more. Empty when replica groups override how blocks are keyed (their bounds differ);
    the pool-dependent references (Belady, sequential LRU) model one engine and are not computed."""
    groups = cfg.cluster.replicas if cfg.cluster is not None else 1
    if not isinstance(groups, int) and any(_POOL_KEYS & set(g.engine) for g in groups):
        return {}
    return {"infinite_cache_hit_rate": _infinite(_references(cfg, engine, shared))}

"""The router interface: what a cluster router sees and decides (mirrors the request path of a real
inference router: llm-d's endpoint picker, Dynamo's KV router, SGLang's router, Mooncake's
Conductor -- see each implementation's docstring for its source file).

A router sees only what a real one sees:

* the request as it arrives (:class:`RouterRequest`: tokens, lengths, salt, LoRA, session), with
  block hashes computed by the router's *own* hasher (:meth:`RouterRequest.hashes`);
* its own state, and the responses it proxies: ``on_first_token`` / ``on_finish``;
* each replica's published metrics (:class:`ReplicaMetrics`, scraped every
  ``metrics_interval_s``) and static facts (block size, pool size, latency model, chunk budget);
* KV events (``BlockStored`` / ``BlockRemoved`` / ``AllBlocksCleared``) when it asks for them
  (``needs_kv_events``), in per-step batches after a delay (:mod:`sim.cluster.kv_event_pipeline`);
* health: ``on_replica_down`` / ``on_replica_up`` and the set of replicas that are up.

It never sees a scheduler, a pool or a queue, except the ``oracle`` router, whose purpose is the
upper bound (``ClusterView.engine``). ``route`` returns a :class:`Decision`: the replica and, for
routers that keep an index, the hit tokens they believed the replica would serve (compared with
the engine's actual hit in the results: false-positive / false-negative residency).

Invariants: routers are deterministic given their seed (``random.Random(seed)``); ``route`` is
called once per request arrival (and again when a downed replica hands a request back), at the
arrival time, with at least one replica up. Imports neither simpy nor torch.
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from sim.core.hashing import BlockHasher, external_block_hash
from sim.core.request import Request, token_array
from sim.replay.intake import trace_int
from workloads.trace_format import TraceRequest

if TYPE_CHECKING:  # pragma: no cover
    from sim.core.kv_events import KVCacheEvent
    from sim.core.scheduler import Scheduler
    from sim.timing.latency import LatencyModel


def external_block_hashes(hashes: Sequence[bytes]) -> list[int]:
    """``[external_block_hash(h) for h in hashes]`` (the low 64 bits of each read big-endian, vLLM's
    event form), in one numpy pass when every hash has one length that is a multiple of 8 -- one
    hasher's digests always do -- else hash by hash. A prompt of 13.7 k tokens has 856 blocks."""
    if not hashes:
        return []
    widths = set(map(len, hashes))  # (a loop in C, as the join)
    width = widths.pop()
    if widths or width % 8:
        return [external_block_hash(h) for h in hashes]
    words = width // 8
    return np.frombuffer(b"".join(hashes), dtype=">u8")[words - 1 :: words].tolist()


@dataclass(frozen=True, slots=True)
class ReplicaMetrics:
    """One replica's published gauges (vLLM's ``num_requests_waiting``, ``num_requests_running``,
    ``kv_cache_usage_perc``) as of ``time`` (the end of its last step before the scrape)."""

    time: float = 0.0
    num_waiting: int = 0
    num_running: int = 0
    kv_usage: float = 0.0


@dataclass(frozen=True, slots=True)
class ReplicaFacts:
    """What a router is configured with per replica (block size, pool size, chunk budget, latency
    model: Mooncake's Conductor fits its prefill-time model offline on the same hardware)."""

    block_size: int
    num_gpu_blocks: int
    max_num_batched_tokens: int
    hash_algo: str
    hash_seed: int | str  # NONE_HASH seed (0.33.0 unset: "vllm-none-hash", sim.experiment.version_keys)
    latency: LatencyModel
    num_hash_lookahead_tokens: int = 0  # vLLM 0.33.0 EAGLE lookahead hashes (sim.core.lookahead_hashing)
    tagged_extra_keys: bool = False  # vLLM 0.33.0's tagged extra keys (sim.core.extra_keys)
    cpu_tier: bool = False  # the engine has vLLM 0.33.0's CPU offload tier (its KV events name "CPU")


@dataclass(slots=True)
class Decision:
    """A routing decision: the replica, and the hit tokens the router believed it would get there
    (None for routers that keep no cache view)."""

    replica: int
    believed_hit_tokens: int | None = None


@dataclass(slots=True)
class RouterRequest:
    """A request as the router receives it; hashes are computed on demand and memoised per hasher."""

    trace: TraceRequest
    index: int  # position in the arrival stream
    _hashes: dict[int, list[int] | array[int]] = field(default_factory=dict)  # id(hasher) -> hashes (words)
    _tokens: Any = None
    # BlockHasher.prompt_key -> the prompt's keys and chain state (for the engine: engine_keys)
    _keys: dict[tuple[Any, ...], tuple[list[bytes], tuple[int, int]]] = field(default_factory=dict)

    @property
    def request_id(self) -> str:
        return self.trace.id

    @property
    def prompt_len(self) -> int:
        return len(self.trace.tokens)

    @property
    def output_tokens(self) -> int:
        return self.trace.output_tokens

    @property
    def session(self) -> str | None:
        return self.trace.session

    def tokens(self) -> np.ndarray:
        """The prompt's token ids (expanded once)."""
        if self._tokens is None:
            self._tokens = token_array(self.trace.tokens)
        return self._tokens

    def hashes(self, hasher: BlockHasher) -> list[int]:
        """The 64-bit hashes of the prompt's full blocks under ``hasher`` (salt and LoRA in the
        extra keys, as vLLM's request hasher puts them), memoised per hasher object (routers keep
        theirs for the whole run)."""
        made = self.words(hasher)
        if isinstance(made, list):
            return made
        out = made.tolist()
        self._hashes[id(hasher)] = out  # (the same values, as a list from now on)
        return out

    def words(self, hasher: BlockHasher) -> list[int] | array[int]:
        """:meth:`hashes` as made: an ``array('Q')`` where the compiled chain made them (no int
        object per block; the compiled index and active blocks read it in place), else the list."""
        key = id(hasher)
        out = self._hashes.get(key)
        if out is None:
            probe = self.probe(hasher)
            made = hasher.prompt_external_hashes(probe)  # (the compiled chain gives the event forms too)
            if made is None:
                keys, state = probe.block_hashes, probe.hash_state
                out = external_block_hashes(keys)
            else:
                keys, out, state = made
            self._hashes[key] = out
            if hasher.prompt_key is not None:
                self._keys[hasher.prompt_key] = (keys, state)
        return out

    def engine_hasher(self, hasher: BlockHasher) -> BlockHasher | AdoptedPromptHasher:
        """``hasher``, or, when :meth:`engine_keys` has its keys, a hasher answering the prompt with them."""
        made = self.engine_keys(hasher)
        return hasher if made is None else AdoptedPromptHasher(hasher, made[0], made[1])

    def engine_keys(self, hasher: BlockHasher) -> tuple[list[bytes], tuple[int, int]] | None:
        """The prompt's keys and chain state as ``hasher`` computes them on the request's first
        lookup, when the router hashed the prompt with an equal hasher (same ``prompt_key``:
        algorithm, block size, seed, lookahead, tagged extra keys), else None: the replica's engine
        takes them instead of hashing the same prompt again (``sim.cluster.replica.RoutedIntake``)."""
        return None if hasher.prompt_key is None else self._keys.get(hasher.prompt_key)

    def probe(self, hasher: BlockHasher) -> Request:
        """A throwaway engine ``Request`` of this prompt (for hashing and the oracle's lookups)."""
        tr = self.trace
        # the trace's own tokens: a prompt held as runs stays runs (hashed by the compiled chain over
        # runs, same keys, never expanded); Python ints and bools: the compiled Request takes no
        # numpy scalars (sim.core.native_build)
        return Request(tr.id, tr.tokens, trace_int(tr, "output_tokens", tr.output_tokens), cache_salt=tr.salt,
                       lora_name=tr.lora, prompt_logprobs=bool(tr.prompt_logprobs), hasher=hasher)


class AdoptedPromptHasher:
    """A replica's request hasher that answers its first call -- the prompt, hashed from block 0 on
    the request's first lookup -- with the keys and chain state an equal hasher already made for it
    (the router's, :meth:`RouterRequest.engine_keys`), and every other call with the engine's own
    ``hasher`` (decode block boundaries; also a first call made after outputs were appended, where
    the prompt's keys alone would not be the answer). Same lists as ``hasher`` alone (a test)."""

    __slots__ = ("hasher", "block_size", "_keys", "_state")

    def __init__(self, hasher: BlockHasher, keys: list[bytes], state: tuple[int, int]) -> None:
        self.hasher = hasher
        self.block_size = hasher.block_size
        self._keys: list[bytes] | None = keys
        self._state = state

    def hash_new_blocks(self, request: Request) -> list[bytes]:
        keys, self._keys = self._keys, None
        if keys is None or request.block_hashes or request.num_tokens != request.num_prompt_tokens:
            return self.hasher.hash_new_blocks(request)
        request.hash_state = self._state
        return keys


class ClusterView(ABC):
    """What the router may query at routing time (implemented by ``sim.cluster.cluster``)."""

    num_replicas: int
    facts: Sequence[ReplicaFacts]

    @property
    @abstractmethod
    def now(self) -> float:
        """Query: the current simulated time."""

    @abstractmethod
    def up(self) -> list[int]:
        """Query: the replicas that are up, in index order."""

    @abstractmethod
    def metrics(self, replica: int) -> ReplicaMetrics:
        """Query: the replica's gauges as the last scrape saw them."""

    @abstractmethod
    def engine(self, replica: int) -> Scheduler:
        """The replica's scheduler -- for the ``oracle`` router only (engine internals)."""

    @abstractmethod
    def pending_tokens(self, replica: int) -> int:
        """Prompt tokens routed to the replica and not yet in its scheduler -- ``oracle`` only."""


class Router(ABC):
    """One routing policy (see the module docstring for what it may see)."""

    name: str = "router"
    needs_kv_events: bool = False
    # on_kv_events only feeds a kv_view.EventCacheView: batches may come as raw words
    # (sim.core.compiled_pool.RawEventBatch, see sim.cluster.kv_event_pipeline), not only objects
    raw_kv_events: bool = False
    needs_metrics: bool = False
    keeps_cache_view: bool = False

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.view: ClusterView | None = None

    def attach(self, view: ClusterView) -> None:
        """Changes state: bind the cluster (once, before the first request)."""
        self.view = view

    @abstractmethod
    def route(self, request: RouterRequest) -> Decision:
        """Changes state: choose a replica among ``view.up()`` and record the choice."""

    def on_first_token(self, request_id: str, replica: int) -> None:
        """Changes state: the replica streamed the request's first token."""

    def on_finish(self, request_id: str, replica: int) -> None:
        """Changes state: the request's response ended."""

    def on_kv_events(self, replica: int, events: Sequence[KVCacheEvent]) -> None:
        """Changes state: a batch of the replica's KV events arrived (``needs_kv_events`` only)."""

    def on_replica_down(self, replica: int) -> None:
        """Changes state: the replica left the pool (its requests come back through ``route``)."""

    def on_replica_up(self, replica: int) -> None:
        """Changes state: the replica (re)joined with an empty cache."""

    def pick_random(self, candidates: Sequence[int]) -> int:
        """One of ``candidates`` uniformly (the random tie-break of the pickers)."""
        return candidates[0] if len(candidates) == 1 else candidates[self.rng.randrange(len(candidates))]


def argbest(scores: dict[int, float], router: Router, *, lowest: bool) -> int:
    """The replica with the best score (lowest or highest), ties broken uniformly at random."""
    best = min(scores.values()) if lowest else max(scores.values())
    return router.pick_random([i for i, s in scores.items() if s == best])

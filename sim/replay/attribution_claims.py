"""The chains running requests are computing, and who produced each token chain: the timeline
state the miss attribution of :mod:`sim.replay.attribution` reads for ``in_flight`` and
``isolation`` (mirrors nothing in vLLM, which forgets a block's producer once it is cached).

A request's *claim* is the chain it will compute once admitted (its prompt and, when the trace
gives its answer, the answer's blocks) past what its admission found or cached at once. A claimed
hash is *in flight* while its claimer runs and has not yet computed past the block. The claims of
an admission are filed lazily (:meth:`InFlightClaims.flush`, at the next allocation, before any
lookup), once the admission has cached what it could, and the claims of finished requests are
dropped at every admission (:meth:`InFlightClaims.sweep`). With a CPU offload tier, a request whose
admission starts an async load (WAITING_FOR_REMOTE_KVS) computes nothing until it is admitted into
``running`` after the load: its claims are dropped at the flush and made again at that admission
(so it never takes over a running claimer's hashes while it waits).

Invariants: reads requests and the KV manager, changes neither. Imports sim.core only.
"""

from __future__ import annotations

from collections import deque
from itertools import repeat

from sim.core.hashing import BlockHash
from sim.core.request import PREEMPTED, RUNNING, WAITING_FOR_REMOTE_KVS, Request
from sim.core.scheduler import Scheduler
from sim.replay.attribution_namespace import Namespace, namespace_of

Producer = tuple[BlockHash, Namespace, str]
"""A token chain's producer: its chain hash under its own extra keys, its namespace, its request."""


class InFlightClaims:
    """Claims of running requests (chain hash -> claimer) and the producers of token chains."""

    def __init__(self, scheduler: Scheduler, hash_block_size: int, unitary: bool) -> None:
        self.scheduler = scheduler
        self.hash_block_size = hash_block_size
        self.unitary = unitary
        self.claims: dict[BlockHash, Request] = {}  # chain hash -> the running request computing it
        self.claimants: dict[str, tuple[Request, list[BlockHash]]] = {}
        # token chain -> (at most two) producers with extra keys; the second differs from the first
        self.tokens: dict[BlockHash, list[Producer]] = {}
        self._pending: tuple[Request, list[BlockHash], int] | None = None  # an admission's claims to file

    def claimer_in_flight(self, h: BlockHash, end: int) -> Request | None:
        """The running request computing the block of chain hash ``h`` whose last token is
        ``end - 1``, if it has not computed that far yet."""
        c = self.claims.get(h)
        if c is None or c.status != RUNNING:
            return None
        return c if c.num_computed_tokens - c.num_output_placeholders < end else None

    def claim(self, r: Request, num_hits: int, hashes: list[BlockHash], tokens: list[BlockHash] | None) -> None:
        """Register the chain ``r`` will compute (``hashes``: its chain, prompt and trace-given
        answer; ``tokens``: the same without extra keys, None when it has none) and its token
        chain; filed by :meth:`flush`."""
        n = len(hashes) if r.output_token_plan is not None else r.num_prompt_tokens // self.hash_block_size
        self._pending = (r, hashes[:n], num_hits)
        if tokens is not None:
            ns, rid, tok = namespace_of(r), r.request_id, self.tokens
            for h, t in zip(hashes[:n], tokens):
                producers = tok.get(t)
                if producers is None:
                    tok[t] = [(h, ns, rid)]
                elif len(producers) < 2 and producers[0][0] != h:
                    producers.append((h, ns, rid))

    def flush(self) -> None:
        """File the pending admission's claims: its chain past what is cached by now (called at
        the next allocation, before any lookup; a block cached by the admission is held, so never
        evicted, while its request runs, and needs no claim)."""
        if self._pending is None:
            return
        r, chain, num_hits = self._pending
        self._pending = None
        if r.status == WAITING_FOR_REMOTE_KVS:
            return  # loading: it claims at its admission into running (module docstring)
        done = num_hits // self.hash_block_size
        if self.unitary:
            done = max(done, self.scheduler.kv_cache_manager.get_num_cached_blocks(r.request_id))
        claimed = chain[done:]
        self.claims.update(dict.fromkeys(claimed, r))  # one claimer per hash: the latest admitted
        self.claimants[r.request_id] = (r, claimed)

    def sweep(self) -> None:
        """Forget the claims of finished requests (they computed, or never will, their chains); at
        every admission, so the claims are those of the running requests and the one admitted."""
        pop = self.claims.pop
        done = [rid for rid, (r, _) in self.claimants.items() if r.status > PREEMPTED]
        for rid in done:
            deque(map(pop, self.claimants.pop(rid)[1], repeat(None)), maxlen=0)  # a later claimer's entry too

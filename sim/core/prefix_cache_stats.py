"""Prefix-cache hit counters (mirrors ``PrefixCacheStats`` of vLLM 0.25.1's ``vllm/v1/metrics/stats.py``).

Invariants: counts are in *tokens* (``queries`` = the looked-up request's ``num_tokens``, ``hits`` =
the hit length); a lookup of a request that was preempted before is counted in the ``preempted_*``
fields only; ``reset`` flags a successful ``reset_prefix_cache`` since the last drain. Imports
nothing from the project.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class PrefixCacheStats:
    """vLLM's ``PrefixCacheStats``: per-lookup token counts, drained by the scheduler each step."""

    requests: int = 0
    queries: int = 0
    hits: int = 0
    preempted_requests: int = 0
    preempted_queries: int = 0
    preempted_hits: int = 0
    reset: bool = False

    def record(self, num_tokens: int, num_hits: int, preempted: bool) -> None:
        """Count one lookup of ``num_tokens`` tokens that hit ``num_hits`` (changes state)."""
        if preempted:
            self.preempted_requests += 1
            self.preempted_queries += num_tokens
            self.preempted_hits += num_hits
        else:
            self.requests += 1
            self.queries += num_tokens
            self.hits += num_hits

    def add(self, other: PrefixCacheStats) -> None:
        """Accumulate ``other`` into these counters (changes state)."""
        self.requests += other.requests
        self.queries += other.queries
        self.hits += other.hits
        self.preempted_requests += other.preempted_requests
        self.preempted_queries += other.preempted_queries
        self.preempted_hits += other.preempted_hits
        self.reset |= other.reset

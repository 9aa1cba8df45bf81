"""Sizing a disaggregated fleet: the prefill and decode replica counts that meet a set of SLOs
(``apcsim size`` on a config with ``cluster.disaggregation``; issue 34 item 6).

Mirrors nothing in vLLM (a planner's question: "how many prefill and how many decode replicas for
this traffic, with TTFT p90 under 2 s and TPOT p90 under 50 ms?"). ``met(P, D)`` -- one replay with
``P`` prefill and ``D`` decode replicas, every SLO met -- is assumed monotone in both counts (a pool
never gets slower with more replicas; routing noise can break it, so every probe is reported).
The answer is the pair with the fewest replicas in all (ties: fewer prefill replicas), found on the
staircase of the met region, capped at ``max_replicas`` per pool:

1. ``P_min``: the smallest ``P`` with ``met(P, max)`` (the decode pool ample), by doubling and
   bisection (``sim.experiment.sizing.smallest``); none: not met within the cap;
2. ``D_min``: the smallest ``D`` with ``met(max, D)``, likewise (no pair has fewer decode replicas);
3. the staircase: for ``P = P_min, P_min + 1, ...`` the smallest ``D(P)`` in ``[D_min, D(P - 1)]``
   (bisection; ``D(P_min - 1)`` is the cap), keeping the best total; it stops once ``P + D_min``
   cannot beat the best, or ``D(P)`` reaches ``D_min`` (more prefill cannot lower it further).

Replays are memoised per pair; nothing else is assumed. Imports neither simpy nor torch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sim.experiment.config import ConfigError, ExperimentConfig
from sim.experiment.sizing import SLO, router_spec, slo_values, smallest, with_pools

__all__ = ["PDSizing", "size_pools", "with_pools"]


@dataclass
class PDSizing:
    """One router's answer: the pools meeting every SLO with the fewest replicas (None: not within
    ``max_replicas`` per pool), and every probe."""

    router: str
    prefill: int | None = None
    decode: int | None = None
    probes: list[dict[str, Any]] = field(default_factory=list)

    @property
    def replicas(self) -> int | None:
        return None if self.prefill is None or self.decode is None else self.prefill + self.decode


def size_pools(cfg: ExperimentConfig, router: str, slos: tuple[SLO, ...], *, max_replicas: int = 64,
               replay: Callable[[ExperimentConfig], dict[str, Any]],
               on_probe: Callable[[str, dict[str, float], bool], None] | None = None) -> PDSizing:
    """The staircase search of the module docstring for one router."""
    if cfg.cluster is None or cfg.cluster.disaggregation is None:
        raise ConfigError(f"{cfg.source}: cluster.disaggregation: sizing by pool needs a disaggregated fleet")
    spec = router_spec(router, cfg)
    out = PDSizing(router)
    seen: dict[tuple[int, int], bool] = {}

    def met(p: int, d: int) -> bool:
        if (p, d) not in seen:
            summary = replay(with_pools(cfg, p, d, spec))
            values, seen[p, d] = slo_values(slos, summary)
            out.probes.append({"prefill": p, "decode": d, **values, "met": seen[p, d],
                               "token_hit_rate": summary.get("token_hit_rate")})
            if on_probe is not None:
                on_probe(f"{router}: {p} prefill + {d} decode", values, seen[p, d])
        return seen[p, d]

    cap = max_replicas
    p_min = smallest(lambda p: met(p, cap), cap)
    if p_min is None:
        return out
    d_min = smallest(lambda d: met(cap, d), cap)
    if d_min is None:  # (monotone: met(p_min, cap) implies met(cap, cap))
        return out
    best: tuple[int, int] | None = None
    d_prev = cap
    for p in range(p_min, cap + 1):
        if best is not None and p + d_min >= sum(best):
            break
        d = smallest(lambda d, p=p: met(p, d), d_prev, start=d_min)  # type: ignore[misc]
        if d is None:
            continue  # routing noise: not met at the previous step's count; try more prefill
        if best is None or p + d < sum(best):
            best = (p, d)
        if d == d_min:
            break
        d_prev = d
    if best is not None:
        out.prefill, out.decode = best
    return out

"""Capacity planning: the smallest replica count per router that meets a latency SLO.

Mirrors nothing in vLLM (a planner's question: "how many replicas of this engine do I need for
this traffic, with this router?"). ``size_fleet`` replays the config's workload with
``cluster.replicas = n`` for the given routers and finds, per router, the smallest ``n`` whose
summary meets the SLO (``ttft_p99=2s``: ``ttft_p99_s <= 2``), by doubling from 1 until the SLO is
met, then bisecting between the last miss and the first hit.

Invariants: the search assumes the metric does not get worse with more replicas (true of the
latency percentiles under a fixed trace, up to routing noise: the probes are reported so a
non-monotone case can be seen); every probe is a full replay of the same stream; an SLO not met
at ``max_replicas`` is reported as such (``replicas: None``). A bad SLO or router is a
``ConfigError``. Imports neither torch nor simpy (replays go through ``sim.experiment.run``).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sim.experiment.config import ConfigError, ExperimentConfig, config_from_dict, config_to_dict

_SLO = re.compile(r"^\s*(ttft|tpot|e2e|queue_time)_(p50|p90|p99|mean)\s*(?:=|<=)\s*([0-9]*\.?[0-9]+)\s*(ms|s)?\s*$")


@dataclass(frozen=True)
class SLO:
    """``metric`` (a summary key such as ``ttft_p99_s``) must be at most ``limit_s`` seconds."""

    metric: str
    limit_s: float

    def met(self, summary: dict[str, Any]) -> bool:
        v = summary.get(self.metric)
        return v is not None and v == v and float(v) <= self.limit_s


def parse_slo(text: str) -> SLO:
    """``ttft_p99=2s``, ``ttft_p50<=500ms``, ``e2e_p90=30`` (seconds when no unit)."""
    m = _SLO.match(text)
    if m is None:
        raise ConfigError(f"--slo {text!r}: expected METRIC=LIMIT, e.g. ttft_p99=2s (metrics: ttft, tpot, e2e, "
                          f"queue_time with _p50, _p90, _p99 or _mean; units s or ms)")
    kind, stat, value, unit = m.groups()
    limit = float(value) / (1000.0 if unit == "ms" else 1.0)
    return SLO(f"{kind}_{stat}_s", limit)


def router_spec(name: str, cfg: ExperimentConfig) -> dict[str, Any]:
    """A router for ``cluster.router``: the config's own when ``name`` is its kind, else ``name``
    at its defaults (``llm_d:approximate`` picks llm-d's prefix mode)."""
    kind, _, prefix = name.partition(":")
    if cfg.cluster is not None and cfg.cluster.router.kind == kind and not prefix:
        return cfg.cluster.router.model_dump()
    spec: dict[str, Any] = {"kind": kind}
    if prefix:
        spec["prefix"] = prefix
    return spec


def check_routers(cfg: ExperimentConfig, routers: list[str]) -> None:
    """Refuse, naming ``--routers``, a router name that is empty, repeated, or not a valid
    ``cluster.router`` (checked on a one-replica fleet, before any replay)."""
    if not routers:
        raise ConfigError("--routers: no router named")
    repeated = sorted({r for r in routers if routers.count(r) > 1})
    if repeated:
        raise ConfigError(f"--routers: {', '.join(repeated)} given twice; name each router once")
    for name in routers:
        try:
            with_fleet(cfg, 1, router_spec(name, cfg))
        except ConfigError as exc:
            problem = str(exc).splitlines()[0].split(": cluster.router", 1)[-1].lstrip(".: ")
            raise ConfigError(f"--routers {name}: not a router apcsim can build ({problem})") from None


def with_fleet(cfg: ExperimentConfig, replicas: int, router: dict[str, Any]) -> ExperimentConfig:
    """``cfg`` with ``replicas`` replicas and ``router`` (the rest of its cluster section kept)."""
    data = config_to_dict(cfg)
    cluster = dict(data.get("cluster") or {})
    cluster.update(replicas=replicas, router=router)
    data["cluster"] = cluster
    return config_from_dict(data, cfg.source, cfg.base_dir)


@dataclass
class Sizing:
    """One router's answer: the smallest count meeting the SLO (None: not within the limit)."""

    router: str
    replicas: int | None
    probes: list[dict[str, Any]] = field(default_factory=list)


def size_router(cfg: ExperimentConfig, router: str, slo: SLO, *, max_replicas: int = 64,
                replay: Callable[[ExperimentConfig], dict[str, Any]],
                on_probe: Callable[[str, int, float, bool], None] | None = None) -> Sizing:
    """Doubling then bisection over ``cluster.replicas`` (see the module docstring)."""
    spec = router_spec(router, cfg)
    out = Sizing(router, None)
    seen: dict[int, bool] = {}

    def probe(n: int) -> bool:
        if n not in seen:
            summary = replay(with_fleet(cfg, n, spec))
            value = float(summary.get(slo.metric, float("nan")))
            seen[n] = slo.met(summary)
            out.probes.append({"replicas": n, slo.metric: value, "met": seen[n],
                               "token_hit_rate": summary.get("token_hit_rate")})
            if on_probe is not None:
                on_probe(router, n, value, seen[n])
        return seen[n]

    lo, hi = 0, 1
    while not probe(hi):
        if hi >= max_replicas:
            return out
        lo, hi = hi, min(hi * 2, max_replicas)
    while hi - lo > 1:  # lo misses (or is 0), hi meets
        mid = (lo + hi) // 2
        if probe(mid):
            hi = mid
        else:
            lo = mid
    out.replicas = hi
    return out

"""Capacity planning: the smallest replica count per router that meets a latency SLO.

Mirrors nothing in vLLM (a planner's question: "how many replicas of this engine do I need for
this traffic, with this router?"). ``size_fleet`` replays the config's workload with
``cluster.replicas = n`` for the given routers and finds, per router, the smallest ``n`` whose
summary meets the SLO (``ttft_p99=2s``: ``ttft_p99_s <= 2``; several joined by commas,
``ttft_p90=2s,tpot_p90=50ms``, must all hold), by doubling from 1 until the SLO is met, then
bisecting between the last miss and the first hit. A disaggregated fleet (``cluster.disaggregation``)
is sized per pool by ``sim.experiment.sizing_pd``.

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


def parse_slos(text: str) -> tuple[SLO, ...]:
    """``ttft_p90=2s,tpot_p90=50ms``: every comma-separated SLO (:func:`parse_slo`), all to be met;
    a metric named twice is refused."""
    slos = tuple(parse_slo(part) for part in text.split(","))
    names = [s.metric for s in slos]
    twice = sorted({m for m in names if names.count(m) > 1})
    if twice:
        raise ConfigError(f"--slo {text!r}: {', '.join(twice)} given twice; name each metric once")
    return slos


def slo_values(slos: tuple[SLO, ...], summary: dict[str, Any]) -> tuple[dict[str, float], bool]:
    """Each SLO metric's value in ``summary`` and whether every SLO is met."""
    return {s.metric: float(summary.get(s.metric, float("nan"))) for s in slos}, all(s.met(summary) for s in slos)


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
    pools = cfg.cluster is not None and cfg.cluster.disaggregation is not None
    for name in routers:
        try:
            if pools:  # a disaggregated fleet: one replica per pool
                with_pools(cfg, 1, 1, router_spec(name, cfg))
            else:
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


def with_pools(cfg: ExperimentConfig, prefill: int, decode: int, router: dict[str, Any]) -> ExperimentConfig:
    """``cfg`` with ``prefill`` + ``decode`` replicas split into the two pools and ``router`` (the
    rest of its cluster and disaggregation sections kept)."""
    data = config_to_dict(cfg)
    cluster = dict(data.get("cluster") or {})
    pd = dict(cluster.get("disaggregation") or {})
    pd.update(prefill=prefill, decode=decode)
    cluster.update(replicas=prefill + decode, router=router, disaggregation=pd)
    data["cluster"] = cluster
    return config_from_dict(data, cfg.source, cfg.base_dir)


@dataclass
class Sizing:
    """One router's answer: the smallest count meeting the SLO (None: not within the limit)."""

    router: str
    replicas: int | None
    probes: list[dict[str, Any]] = field(default_factory=list)


def size_router(cfg: ExperimentConfig, router: str, slo: SLO | tuple[SLO, ...], *, max_replicas: int = 64,
                replay: Callable[[ExperimentConfig], dict[str, Any]],
                on_probe: Callable[[str, dict[str, float], bool], None] | None = None) -> Sizing:
    """Doubling then bisection over ``cluster.replicas`` (see the module docstring); ``on_probe``
    gets each probe's label (``"<router>: <n> replicas"``), SLO values and verdict."""
    slos = (slo,) if isinstance(slo, SLO) else slo
    spec = router_spec(router, cfg)
    out = Sizing(router, None)
    seen: dict[int, bool] = {}

    def probe(n: int) -> bool:
        if n not in seen:
            summary = replay(with_fleet(cfg, n, spec))
            values, seen[n] = slo_values(slos, summary)
            out.probes.append({"replicas": n, **values, "met": seen[n],
                               "token_hit_rate": summary.get("token_hit_rate")})
            if on_probe is not None:
                on_probe(f"{router}: {n} replicas", values, seen[n])
        return seen[n]

    found = smallest(probe, max_replicas)
    out.replicas = found
    return out


def smallest(met: Callable[[int], bool], limit: int, start: int = 1) -> int | None:
    """The smallest ``n`` in ``[start, limit]`` with ``met(n)``, assuming ``met`` is monotone:
    doubling from ``start`` until met, then bisection between the last miss and the first hit
    (None: not met at ``limit``)."""
    lo, hi = start - 1, start
    while not met(hi):
        if hi >= limit:
            return None
        lo, hi = hi, min(hi * 2, limit)
    while hi - lo > 1:  # lo misses (or is below start), hi meets
        mid = (lo + hi) // 2
        if met(mid):
            hi = mid
        else:
            lo = mid
    return hi

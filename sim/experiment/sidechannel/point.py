"""One side-channel point: the background workload and the parties replayed together through the
normal replay, then each attack scored from what the attacker sees.

Mirrors nothing in vLLM. Steps:

1. resolve the engine; the salt policy is ``workload.tenants.salt`` (``none`` without tenants) and
   applies to the background, the victim and the attacker alike;
2. plan the parties (``sim.experiment.sidechannel.parties``); background requests arriving more
   than ``tail_s`` after the last party request are not replayed (``cut_s``): nothing arriving
   later can change a step that started earlier, so every probe whose first token came by then
   has exactly the TTFT of the full replay. When a probe is answered later (a saturated engine),
   the cut moves to that answer plus ``tail_s`` and the point is replayed again, up to
   :data:`MAX_CUTS` replays (``probes_after_cut`` counts the probes still answered after it);
3. replay background + parties, merged by arrival, with :func:`sim.experiment.run.replay_experiment`
   -- the engine, scheduler and executor of any other run; the probes are ordinary requests --,
   and the background alone (the policy's cost in hit rate);
4. the attacker's observation of a probe is its TTFT plus a network delay drawn from
   ``network`` (stream ``TAG_NETWORK``, one draw per probe in plan order);
5. score: presence -- ``separation`` of the labels by ``-observed`` (a hit is faster); capacity --
   by ``+observed`` (an evicted prefix is slower); reconstruction -- per round the fastest candidate
   (ties broken at random, stream ``TAG_TIES``), success over the first n blocks = every round up to
   n right.

Row columns (besides the replay's summary): ``presence_*`` / ``capacity_*`` (``auc``, ``auc_ci_low``,
``auc_ci_high``, ``best_accuracy``, ``ks_statistic``, ``ks_pvalue``, ``n_pos``, ``n_neg``, ...),
``recon_success_n{k}`` for k = 1..blocks, ``recon_block_accuracy``, ``recon_probes_per_block``,
``background_hit_rate`` / ``victim_hit_rate`` (hit tokens at first admission / prompt tokens of
those requests), ``background_alone_hit_rate`` (the same for the background replayed alone up to
the same cut: what the policy costs legitimate traffic, free of the attack's own cache churn;
``background_alone_token_hit_rate``: vLLM's token hit rate of that replay),
``background_ttft_p50_s``, ``background_rps`` (background arrivals per second between the first
and the last party request), ``engine_busy_fraction`` (the share of that span
the engine was stepping), ``cut_s``, ``probes_after_cut``. Files: ``probes.parquet`` (one row
per probe: attack, trial, label, block, candidate, arrival, first token, ``ttft``, ``observed_ttft``,
``hit_tokens``, ``prompt_tokens``).

Invariants: a pure function of the config (same config, same row and files). Imports simpy only
through ``sim.experiment.run``, never torch.
"""

from __future__ import annotations

import heapq
import io
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from sim.experiment.config import ConfigError, ExperimentConfig
from sim.experiment.engine_description import EngineDescription
from sim.experiment.run import replay_experiment
from sim.experiment.sidechannel.parties import PREFIX, TAG_BOOTSTRAP, TAG_NETWORK, TAG_TIES, PartyPlan, build_parties
from sim.experiment.sidechannel.statistics import separation
from sim.experiment.workload import build_workload
from sim.replay.engine import ReplayResult
from workloads.dists import rng_for
from workloads.registry import Workload
from workloads.trace_format import TraceRequest

MAX_CUTS = 4
"""Replays tried per point: while a probe's first token comes after the cut, the cut moves to that
first token plus ``tail_s`` and the point is replayed again."""

PROBE_COLUMNS = ("request_id", "attack", "trial", "label", "block", "candidate", "arrival", "first_token", "ttft",
                 "observed_ttft", "hit_tokens", "prompt_tokens", "after_cut")


@dataclass
class SideChannelResult:
    """The replay, its workload, the point's side-channel row columns and extra files."""

    replay: ReplayResult
    workload: Workload
    metrics: dict[str, Any]
    probes: pd.DataFrame
    files: dict[str, bytes] = field(default_factory=dict)


def _check_lengths(cfg: ExperimentConfig, plan: PartyPlan, engine: EngineDescription) -> None:
    longest = max((len(r.tokens) for r in plan.requests), default=0)
    if longest > engine.max_model_len:
        raise ConfigError(f"{cfg.source}: sidechannel: a party prompt of {longest} tokens exceeds max_model_len "
                          f"{engine.max_model_len}; shorten the secrets / primes or raise engine.max_model_len")


class _Background:
    """The background stream up to ``cut_s``; remembers its last arrival and whether it ran out."""

    def __init__(self, requests: Iterable[TraceRequest], cut_s: float) -> None:
        self.source = iter(requests)
        self.cut_s = cut_s
        self.last_arrival = 0.0
        self.exhausted = False

    def __iter__(self) -> Iterator[TraceRequest]:
        for r in self.source:
            if r.arrival > self.cut_s:
                return
            if r.id.startswith(PREFIX):
                raise ConfigError(f"background request id {r.id!r} starts with {PREFIX!r}, reserved for the parties")
            self.last_arrival = r.arrival
            yield r
        self.exhausted = True


def _reconstruction(probes: pd.DataFrame, blocks: int, seed: int) -> dict[str, Any]:
    rec = probes[probes["attack"] == "reconstruction"]
    if rec.empty:
        return {}
    rng = rng_for(seed, TAG_TIES)
    rec = rec.assign(_tie=rng.random(len(rec)))
    fastest = rec.sort_values(["trial", "block", "observed_ttft", "_tie"]).groupby(["trial", "block"]).head(1)
    right = fastest.pivot(index="trial", columns="block", values="label").sort_index(axis=1).to_numpy(bool)
    out: dict[str, Any] = {"recon_trials": int(right.shape[0]), "recon_blocks": blocks,
                           "recon_probes_per_block": int(rec.groupby(["trial", "block"]).size().iloc[0]),
                           "recon_block_accuracy": float(right.mean())}
    prefix_ok = np.logical_and.accumulate(right, axis=1)
    for k in range(1, blocks + 1):
        out[f"recon_success_n{k}"] = float(prefix_ok[:, k - 1].mean())
    return out


def _scored(prefix: str, sub: pd.DataFrame, sign: float, cfg: ExperimentConfig, seed: int,
            tag: int) -> dict[str, Any]:
    if sub.empty:
        return {}
    st = cfg.sidechannel.statistics  # type: ignore[union-attr]
    s = separation(sub["label"].to_numpy(), sign * sub["observed_ttft"].to_numpy(), resamples=st.bootstrap_resamples,
                   confidence=st.confidence, rng=rng_for(seed, TAG_BOOTSTRAP, tag))
    s["ttft_pos_median_s"] = float(sub.loc[sub["label"] == 1, "observed_ttft"].median())
    s["ttft_neg_median_s"] = float(sub.loc[sub["label"] == 0, "observed_ttft"].median())
    return {f"{prefix}_{k}": v for k, v in s.items()}


def _hit_rate(df: pd.DataFrame) -> float:
    prompt = float(df["prompt_tokens"].sum())
    return float(df["hit_tokens"].fillna(0).sum()) / prompt if prompt else float("nan")


def _load_facts(result: ReplayResult, bg: pd.DataFrame, plan: PartyPlan) -> dict[str, Any]:
    t0 = plan.requests[0].arrival if plan.requests else 0.0
    t1 = plan.last_arrival
    span = max(t1 - t0, 1e-9)
    steps = result.steps
    start = steps["start"].to_numpy()
    end = start + steps["duration"].to_numpy()
    busy = float(np.clip(np.minimum(end, t1) - np.maximum(start, t0), 0.0, None).sum())
    arrivals = bg["arrival"].to_numpy()
    return {"background_rps": float(((arrivals >= t0) & (arrivals <= t1)).sum()) / span,
            "engine_busy_fraction": busy / span}


@dataclass(frozen=True)
class _Setup:
    plan: PartyPlan
    policy: str
    seed: int
    cut_s: float


def _setup(cfg: ExperimentConfig, engine: EngineDescription) -> _Setup:
    sc = cfg.sidechannel
    if sc is None:
        raise ConfigError(f"{cfg.source}: sidechannel: this config has no sidechannel section")
    tenants = cfg.workload.tenants
    policy = tenants.salt if tenants is not None else "none"
    seed = sc.seed if sc.seed is not None else cfg.seed
    plan = build_parties(sc, policy, block_size=engine.block_size, capacity_tokens=engine.capacity_tokens,
                         num_background_tenants=tenants.num_tenants if tenants is not None else 1, seed=seed)
    _check_lengths(cfg, plan, engine)
    return _Setup(plan, policy, seed, plan.last_arrival + sc.tail_s)


def _merged(setup: _Setup, background: Iterable[TraceRequest],
            cut_s: float) -> tuple[_Background, Iterator[TraceRequest]]:
    bg = _Background(background, cut_s)
    return bg, heapq.merge(bg, setup.plan.requests, key=lambda r: r.arrival)  # ties: background first


def replayed_requests(cfg: ExperimentConfig, engine: EngineDescription,
                      cut_s: float | None = None) -> list[TraceRequest]:
    """The request stream :func:`run_point` replays (background up to the cut -- ``cut_s``, default
    the first one tried --, merged with the parties), materialised: to check that the engine sees
    nothing but ordinary requests."""
    setup = _setup(cfg, engine)
    return list(_merged(setup, build_workload(cfg, engine).requests, cut_s if cut_s is not None else setup.cut_s)[1])


def run_point(cfg: ExperimentConfig, engine: EngineDescription) -> SideChannelResult:
    """Replay ``cfg``'s background with its side-channel parties and score the attacks."""
    setup = _setup(cfg, engine)
    sc = cfg.sidechannel
    assert sc is not None  # checked by _setup
    plan, policy, seed, cut = setup.plan, setup.policy, setup.seed, setup.cut_s
    probe_ids = [p.request_id for p in plan.probes]
    for attempt in range(MAX_CUTS):
        background: list[_Background] = []

        def stream(workload: Workload, cut_s: float = cut) -> Iterator[TraceRequest]:
            bg, merged = _merged(setup, workload.requests, cut_s)
            background.append(bg)
            return merged

        result, workload = replay_experiment(cfg, progress=False, engine=engine, requests=stream)
        bg_stream = background[0]
        if bg_stream.exhausted and bg_stream.last_arrival < plan.last_arrival:
            raise ConfigError(
                f"{cfg.source}: workload: the background traffic ends at t={bg_stream.last_arrival:.1f} s, before "
                f"the side-channel parties (last request at t={plan.last_arrival:.1f} s); make the workload longer "
                f"(more sessions or requests) or the attacks shorter")
        latest = float(result.requests.set_index("request_id").loc[probe_ids, "first_token"].max())
        if bg_stream.exhausted or latest <= cut or attempt == MAX_CUTS - 1:
            break
        cut = latest + sc.tail_s  # a probe answered after the cut: replay again with more background
    complete = bg_stream.exhausted  # every background request was replayed: nothing was cut
    # the policy's cost: the same background up to the same cut, replayed alone (no attacker, no victim)
    alone, _ = replay_experiment(cfg, progress=False, engine=engine,
                                 requests=lambda w: iter(_Background(w.requests, cut)))
    req = result.requests
    party = req["request_id"].str.startswith(PREFIX)
    probes = pd.DataFrame([asdict(p) for p in plan.probes])
    probes = probes.merge(req[["request_id", "arrival", "first_token", "ttft", "hit_tokens", "prompt_tokens"]],
                          on="request_id", how="left", validate="one_to_one")
    delay = sc.network.to_dist().sample(rng_for(seed, TAG_NETWORK), len(probes))
    probes["observed_ttft"] = probes["ttft"].to_numpy() + delay
    probes["after_cut"] = (probes["first_token"] > cut) & (not complete)
    probes = probes[list(PROBE_COLUMNS)]
    bg = req[~party]
    victim = req[req["request_id"].str.startswith(PREFIX) & req["request_id"].str.contains("-victim-")]
    metrics: dict[str, Any] = {
        "salt_policy": policy, "attacker_domain": sc.attacker.domain, "cut_s": cut,
        "probes_after_cut": int(probes["after_cut"].sum()), "background_requests": int(len(bg)),
        "background_hit_rate": _hit_rate(bg), "victim_hit_rate": _hit_rate(victim),
        "background_alone_hit_rate": _hit_rate(alone.requests),
        "background_alone_token_hit_rate": alone.summary["token_hit_rate"],
        "background_ttft_p50_s": float(bg["ttft"].median()) if len(bg) else float("nan"),
        "capacity_prime_requests": plan.prime_requests,
        **_load_facts(result, bg, plan),
    }
    for name, (a, b) in plan.phases.items():
        metrics[f"{name}_start_s"], metrics[f"{name}_end_s"] = a, b
    metrics.update(_scored("presence", probes[probes["attack"] == "presence"], -1.0, cfg, seed, 1))
    metrics.update(_reconstruction(probes, sc.reconstruction.blocks, seed))
    metrics.update(_scored("capacity", probes[probes["attack"] == "capacity"], 1.0, cfg, seed, 2))
    buf = io.BytesIO()
    probes.to_parquet(buf, index=False)
    return SideChannelResult(result, workload, metrics, probes, {"probes.parquet": buf.getvalue()})

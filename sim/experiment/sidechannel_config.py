"""The ``sidechannel:`` section of an experiment config: a timing side-channel experiment on top of
the config's workload (pydantic models; unknown keys are errors; mirrors nothing in vLLM).

Three parties share the engine (``sim.experiment.sidechannel``): the config's ``workload`` is the
*background* traffic (with its tenants and salt policy, ``workload.tenants.salt``); a *victim*
tenant sends requests holding secrets; an *attacker* tenant, in the victim's salt domain or
outside it (``attacker.domain``), sends probes and sees only their time to first token. The attacks
run one after the other on one timeline, after ``warmup_s`` of background traffic:

* ``presence``: did the victim send document P within the last ``window_s`` seconds?
* ``reconstruction``: recover a secret block by block from ``candidates`` guesses per block;
* ``capacity``: prime + probe -- does the victim's activity evict the attacker's own blocks?

Every time is in seconds of simulated time; every count of tokens is in tokens. Invariants: every
model is frozen and forbids unknown keys. Imports neither simpy nor torch, and nothing from
``sim.experiment.config`` (which imports this module).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from workloads.schema import DistField, DistSpec

Pos = Annotated[int, Field(gt=0)]
NonNeg = Annotated[int, Field(ge=0)]
Seconds = Annotated[float, Field(gt=0)]
NonNegSeconds = Annotated[float, Field(ge=0)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class VictimSpec(_Strict):
    """The victim tenant: a public system prompt (the same for every tenant, known to the
    attacker), then its secret content, then a question of its own. ``secret_in``: the secret is a
    ``document`` (after the system prompt) or part of the ``system_prompt`` itself (which matters
    for the ``shared_system_prompt`` policy: its tenant tag follows the system prompt, so a secret
    system prompt is shared by every tenant); the attacker's probes put their candidate in the same
    place."""

    tenant: NonNeg | None = None  # tenant index; default: the first index after the background's tenants
    secret_in: Literal["document", "system_prompt"] = "document"
    system_prompt_tokens: NonNeg = 256
    question_tokens: Pos = 32
    output_tokens: Pos = 16


class AttackerSpec(_Strict):
    """The attacker: ``same`` shares the victim's tenant, user and session (so its salt under every
    policy), ``same_tenant`` shares the tenant only (another user and session), ``other`` is another
    tenant. A probe is a candidate prefix plus ``suffix_tokens`` fresh tokens, one output token."""

    domain: Literal["same", "same_tenant", "other"] = "other"
    suffix_tokens: Pos = 16


class PresenceSpec(_Strict):
    """Attack (a): the victim sends ``victim_requests`` requests (Poisson, ``victim_rate`` per
    second), each holding a fresh secret document of ``secret_tokens``. For each, the attacker
    probes that document (a true candidate) and a fresh document nobody sent (a false one), each
    at its own uniform lag in ``[min_lag_s, window_s]`` after the victim's request. The attacker
    sends its probes one at a time: a probe due less than ``probe_spacing_s`` after the previous
    one waits until then (so its lag may exceed ``window_s`` by that wait)."""

    enabled: bool = True
    victim_requests: Pos = 100
    victim_rate: Seconds = 0.5
    secret_tokens: Pos = 1024
    window_s: Seconds = 2.0
    min_lag_s: NonNegSeconds = 0.05
    probe_spacing_s: NonNegSeconds = 0.1

    @model_validator(mode="after")
    def _lags(self) -> PresenceSpec:
        if self.min_lag_s > self.window_s:
            raise ValueError("min_lag_s must be <= window_s")
        return self


class ReconstructionSpec(_Strict):
    """Attack (b): per trial the victim sends ``victim_requests`` requests (``victim_gap_s`` apart)
    whose secret is ``blocks`` engine blocks; then the attacker runs one round per block,
    ``round_gap_s`` apart: ``candidates`` probes (the true block among them, random order,
    ``probe_gap_s`` apart) extending the prefix recovered so far, and keeps the fastest."""

    enabled: bool = True
    trials: Pos = 8
    blocks: Pos = 4
    candidates: Annotated[int, Field(ge=2)] = 4
    victim_requests: Pos = 2
    victim_gap_s: Seconds = 0.2
    round_gap_s: Seconds = 0.5
    probe_gap_s: Seconds = 0.1
    lag_s: NonNegSeconds = 0.3  # from the victim's last request to the first round

    @model_validator(mode="after")
    def _round_fits(self) -> ReconstructionSpec:
        if self.candidates * self.probe_gap_s > self.round_gap_s:
            raise ValueError("candidates * probe_gap_s must be <= round_gap_s (a round ends before the next)")
        return self


class CapacitySpec(_Strict):
    """Attack (c), prime + probe: per trial the attacker fills ``prime_fraction`` of the KV pool with
    fresh prompts of ``prime_request_tokens`` (``prime_gap_s`` apart), waits ``wait_s`` and probes
    its first (least recently used) prompt again. In half the trials (random) the victim sends
    ``burst_requests`` requests with fresh documents of ``burst_tokens`` during the wait."""

    enabled: bool = True
    trials: Annotated[int, Field(ge=2)] = 30
    prime_fraction: Annotated[float, Field(gt=0, le=1)] = 0.8
    prime_request_tokens: Pos = 2048
    prime_gap_s: Seconds = 0.05
    wait_s: Seconds = 1.0
    burst_requests: Pos = 4
    burst_tokens: Pos = 2048
    trial_gap_s: NonNegSeconds = 0.5


class StatisticsSpec(_Strict):
    """ROC AUC confidence interval: stratified bootstrap (``scipy.stats.bootstrap``, percentile)."""

    bootstrap_resamples: Annotated[int, Field(ge=100)] = 1000
    confidence: Annotated[float, Field(gt=0, lt=1)] = 0.95


class SideChannelConfig(_Strict):
    """The side-channel experiment (see the module docstring). ``network`` is the round-trip
    network delay added to every probe's TTFT as the attacker sees it (a number = fixed seconds,
    or ``{dist: ...}``); ``tail_s``: background traffic keeps arriving this long after the last
    party request; ``seed``: the parties' streams (default: the experiment seed)."""

    seed: int | None = None
    warmup_s: NonNegSeconds = 10.0
    phase_gap_s: NonNegSeconds = 3.0
    tail_s: NonNegSeconds = 5.0
    network: DistField = DistSpec(dist="lognormal", median=0.002, sigma=0.5)
    victim: VictimSpec = VictimSpec()
    attacker: AttackerSpec = AttackerSpec()
    presence: PresenceSpec = PresenceSpec()
    reconstruction: ReconstructionSpec = ReconstructionSpec()
    capacity: CapacitySpec = CapacitySpec()
    statistics: StatisticsSpec = StatisticsSpec()

    @model_validator(mode="after")
    def _something_to_do(self) -> SideChannelConfig:
        if not (self.presence.enabled or self.reconstruction.enabled or self.capacity.enabled):
            raise ValueError("enable at least one attack (presence, reconstruction or capacity)")
        return self

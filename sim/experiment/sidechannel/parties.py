"""The victim's and the attacker's requests of a side-channel experiment, on one timeline.

Mirrors nothing in vLLM: what two clients of a shared vLLM server send. Every party request is an
ordinary :class:`~workloads.trace_format.TraceRequest` salted by the experiment's salt policy
(``workloads.tenants.apply_salt_policy``, the function the background's tenants go through), so the
engine cannot tell a probe from any other request.

Timeline (seconds; ``warmup_s`` of background traffic first, ``phase_gap_s`` between phases):

1. **presence**: victim request j (Poisson, ``victim_rate``) = public system prompt + secret
   document D_j + question. The attacker probes D_j (label 1) and a fresh decoy document F_j that
   nobody sent (label 0), each at its own uniform lag in ``[min_lag_s, window_s]`` after the
   victim's request (the attacker sends one probe at a time, at least ``probe_spacing_s`` apart):
   true and false probes have the same timing distribution, and every candidate is probed once
   (a probe caches its candidate in the attacker's own namespace, so probing it twice would
   measure the attacker itself).
2. **reconstruction**: trial j's secret S_j is ``blocks`` engine blocks after the public system
   prompt; the victim sends it ``victim_requests`` times, then the attacker runs round b = 0, 1, ...:
   ``candidates`` probes public + S_j[:b blocks] + candidate + suffix, the true block S_j[b] at a
   random position among fresh decoy blocks. Rounds are sent at fixed times, each extending the
   *true* prefix: while every decision so far is right, that is exactly what an adaptive attacker
   (who waits ``round_gap_s`` for each round's answers) sends; after the first wrong decision the
   attack has failed whatever it sends next, so success over the first n blocks is the adaptive
   attacker's.
3. **capacity** (prime + probe): trial j: the attacker sends fresh prompts covering
   ``prime_fraction`` of the pool's capacity, waits ``wait_s``, and re-sends its first prompt (the
   least recently used one) with a new suffix; in a random half of the trials (label 1) the victim
   sends ``burst_requests`` requests with fresh documents during the wait.

With ``victim.secret_in: system_prompt`` the secret (and each candidate) ends the system prompt
(``TraceRequest.system_tokens``), else the system prompt is the public part only.

Parties: the victim is tenant ``V`` (``victim.tenant``, default the first index after the
background's tenants), user 0, one session per phase (per trial in reconstruction). The attacker
is, by ``attacker.domain``: ``same`` -- tenant V, user 0, the victim's session (its salt under
every policy, even ``per_session``; under ``per_request`` no two requests share a salt);
``same_tenant`` -- tenant V, user 1, its own session; ``other`` -- tenant V + 1.

Content: distinct token-id regions (``workloads.tokens.region``) of kinds 56-61 (public prompt,
secrets, questions, decoys, suffixes, primes): content is fresh unless stated, so nothing is shared
by accident. Randomness: ``rng_for(seed, TAG_*)`` streams with the tags below; the plan is a pure
function of the section, the policy, the engine's block size and capacity, and the seed.
Imports neither simpy nor torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from sim.experiment.sidechannel_config import SideChannelConfig
from workloads.dists import rng_for
from workloads.tenants import SaltPolicy, apply_salt_policy
from workloads.tokens import TokenSpace, region, run_ids
from workloads.trace_format import TraceRequest

# Token-id region kinds of the parties' content (workloads.tokens uses kinds below 16).
K_PUBLIC, K_SECRET, K_QUESTION, K_DECOY, K_SUFFIX, K_PRIME = 56, 57, 58, 59, 60, 61

# Random-stream tags (rng_for(seed, tag)).
TAG_PRESENCE_TIMES = 301  # the victim's presence-phase arrival gaps
TAG_PRESENCE_LAGS = 302  # lags of the true and false probes after the victim's request
TAG_RECON_ORDER = 303  # position of the true block among each round's candidates
TAG_CAPACITY_LABELS = 304  # which capacity trials have an active victim (a balanced permutation)
TAG_CAPACITY_BURST = 305  # arrival offsets of the victim's burst inside the wait
TAG_NETWORK = 306  # network delay added to each probe's TTFT (sim.experiment.sidechannel.point)
TAG_TIES = 307  # tie-breaking among equally fast reconstruction candidates
TAG_BOOTSTRAP = 308  # bootstrap resampling of the AUC confidence intervals

PREFIX = "sc-"
"""Every party request id starts with this (background ids never do: checked by the replay,
which refuses duplicate ids)."""


@dataclass(frozen=True, slots=True)
class Party:
    """Who sends a request: tenant and user indices and the session (they decide its salt)."""

    tenant: int
    user: int
    session: str


@dataclass(slots=True)
class Probe:
    """One attacker request the attack scores. ``label``: presence -- the victim sent the
    candidate; reconstruction -- the candidate is the true block; capacity -- the victim was
    active during the wait. ``block``/``candidate``: reconstruction round and position (else -1)."""

    request_id: str
    attack: str
    trial: int
    label: int
    block: int = -1
    candidate: int = -1


@dataclass
class PartyPlan:
    """The parties' requests (sorted by arrival), the probes to score and each phase's span."""

    requests: list[TraceRequest]
    probes: list[Probe]
    phases: dict[str, tuple[float, float]] = field(default_factory=dict)
    victim_tenant: int = 0
    prime_requests: int = 0

    @property
    def last_arrival(self) -> float:
        return self.requests[-1].arrival if self.requests else 0.0


class _Builder:
    """Allocates content and appends requests; one per plan."""

    def __init__(self, sc: SideChannelConfig, policy: SaltPolicy, victim_tenant: int, seed: int) -> None:
        self.sc = sc
        self.policy = policy
        self.seed = seed
        self.victim_tenant = victim_tenant
        self.spaces = {k: TokenSpace(region(k, 0)) for k in (K_PUBLIC, K_SECRET, K_QUESTION, K_DECOY, K_SUFFIX,
                                                              K_PRIME)}
        self.public = self.fresh(K_PUBLIC, sc.victim.system_prompt_tokens)
        self.requests: list[TraceRequest] = []
        self.probes: list[Probe] = []

    def fresh(self, kind: int, n: int) -> np.ndarray:
        return run_ids(self.spaces[kind].fresh(n))

    def attacker(self, victim: Party) -> Party:
        domain = self.sc.attacker.domain
        if domain == "same":
            return victim
        if domain == "same_tenant":
            return Party(victim.tenant, victim.user + 1, f"{PREFIX}attacker")
        return Party(victim.tenant + 1, 0, f"{PREFIX}attacker")

    def add(self, rid: str, t: float, parts: list[np.ndarray], party: Party, output_tokens: int,
            system_tokens: int) -> None:
        req = TraceRequest(PREFIX + rid, float(t), np.concatenate(parts), output_tokens, session=party.session,
                           system_tokens=system_tokens)
        apply_salt_policy(req, self.policy, party.tenant, party.user, party.session)
        self.requests.append(req)

    def system_tokens(self, secret_tokens: int) -> int:
        """Where the system prompt ends (``victim.secret_in``): after the public prompt, or after the
        secret (or the candidate) that follows it."""
        in_prompt = self.sc.victim.secret_in == "system_prompt"
        return len(self.public) + (secret_tokens if in_prompt else 0)

    def victim_request(self, rid: str, t: float, content: np.ndarray, party: Party) -> None:
        v = self.sc.victim
        self.add(rid, t, [self.public, content, self.fresh(K_QUESTION, v.question_tokens)], party, v.output_tokens,
                 self.system_tokens(len(content)))

    def probe(self, rid: str, t: float, parts: list[np.ndarray], party: Party, system_tokens: int,
              record: Probe) -> None:
        self.add(rid, t, [*parts, self.fresh(K_SUFFIX, self.sc.attacker.suffix_tokens)], party, 1, system_tokens)
        self.probes.append(record)

    # -- phases --------------------------------------------------------------------------------
    def presence(self, t0: float) -> float:
        p = self.sc.presence
        n = p.victim_requests
        times = t0 + np.cumsum(rng_for(self.seed, TAG_PRESENCE_TIMES).exponential(1.0 / p.victim_rate, n))
        lags = rng_for(self.seed, TAG_PRESENCE_LAGS).uniform(p.min_lag_s, p.window_s, size=(n, 2))
        sent = _spaced((times[:, None] + lags).ravel(), p.probe_spacing_s).reshape(n, 2)
        victim = Party(self.victim_tenant, 0, f"{PREFIX}victim-presence")
        att = self.attacker(victim)
        sys_n = self.system_tokens(p.secret_tokens)
        for j in range(n):
            doc = self.fresh(K_SECRET, p.secret_tokens)
            self.victim_request(f"presence-victim-{j}", times[j], doc, victim)
            decoy = self.fresh(K_DECOY, p.secret_tokens)
            for k, (label, cand) in enumerate(((1, doc), (0, decoy))):
                rid = f"presence-probe-{j}-{'true' if label else 'false'}"
                self.probe(rid, sent[j, k], [self.public, cand], att, sys_n, Probe(PREFIX + rid, "presence", j, label))
        return float(sent.max())

    def reconstruction(self, t0: float, block_size: int) -> float:
        r = self.sc.reconstruction
        rng = rng_for(self.seed, TAG_RECON_ORDER)
        t = t0
        for j in range(r.trials):
            victim = Party(self.victim_tenant, 0, f"{PREFIX}victim-recon-{j}")
            att = self.attacker(victim)
            secret = self.fresh(K_SECRET, r.blocks * block_size)
            for i in range(r.victim_requests):
                self.victim_request(f"recon-victim-{j}-{i}", t + i * r.victim_gap_s, secret, victim)
            first_round = t + (r.victim_requests - 1) * r.victim_gap_s + r.lag_s
            for b in range(r.blocks):
                true_pos = int(rng.integers(r.candidates))
                known = secret[: b * block_size]
                for m in range(r.candidates):
                    cand = secret[b * block_size:(b + 1) * block_size] if m == true_pos else self.fresh(K_DECOY,
                                                                                                       block_size)
                    rid = f"recon-probe-{j}-{b}-{m}"
                    self.probe(rid, first_round + b * r.round_gap_s + m * r.probe_gap_s, [self.public, known, cand],
                               att, self.system_tokens((b + 1) * block_size),
                               Probe(PREFIX + rid, "reconstruction", j, int(m == true_pos), b, m))
            t = first_round + r.blocks * r.round_gap_s
        return t

    def capacity(self, t0: float, capacity_tokens: int) -> tuple[float, int]:
        c = self.sc.capacity
        n_prime = max(1, math.ceil(c.prime_fraction * capacity_tokens / c.prime_request_tokens))
        half = c.trials // 2
        labels = rng_for(self.seed, TAG_CAPACITY_LABELS).permutation(np.r_[np.ones(half, int),
                                                                          np.zeros(c.trials - half, int)])
        burst_rng = rng_for(self.seed, TAG_CAPACITY_BURST)
        victim = Party(self.victim_tenant, 0, f"{PREFIX}victim-capacity")
        att = self.attacker(victim)
        t = t0
        for j in range(c.trials):
            offsets = np.sort(burst_rng.uniform(0.0, c.wait_s, c.burst_requests))  # drawn in every trial
            primes = [self.fresh(K_PRIME, c.prime_request_tokens) for _ in range(n_prime)]
            for m, prime in enumerate(primes):
                self.add(f"capacity-prime-{j}-{m}", t + m * c.prime_gap_s,
                         [prime, self.fresh(K_SUFFIX, self.sc.attacker.suffix_tokens)], att, 1, 0)
            wait_start = t + (n_prime - 1) * c.prime_gap_s
            if labels[j]:
                for i, off in enumerate(offsets):
                    self.victim_request(f"capacity-victim-{j}-{i}", wait_start + off,
                                        self.fresh(K_SECRET, c.burst_tokens), victim)
            rid = f"capacity-probe-{j}"
            self.probe(rid, wait_start + c.wait_s, [primes[0]], att, 0, Probe(PREFIX + rid, "capacity", j,
                                                                                   int(labels[j])))
            t = wait_start + c.wait_s + c.trial_gap_s
        return t, n_prime


def _spaced(times: np.ndarray, spacing: float) -> np.ndarray:
    """``times`` (any order) with each moved later, in time order, to at least ``spacing`` after
    the previous one; returned in the input's order."""
    order = np.argsort(times, kind="stable")
    out = times.astype(np.float64).copy()
    prev = -np.inf
    for i in order:
        out[i] = max(out[i], prev + spacing)
        prev = out[i]
    return out


def build_parties(sc: SideChannelConfig, policy: SaltPolicy, *, block_size: int, capacity_tokens: int,
                  num_background_tenants: int, seed: int) -> PartyPlan:
    """The parties' plan (see the module docstring); ``seed``: the parties' seed."""
    victim_tenant = sc.victim.tenant if sc.victim.tenant is not None else num_background_tenants
    b = _Builder(sc, policy, victim_tenant, seed)
    phases: dict[str, tuple[float, float]] = {}
    t = sc.warmup_s
    n_prime = 0
    if sc.presence.enabled:
        end = b.presence(t)
        phases["presence"] = (t, end)
        t = end + sc.phase_gap_s
    if sc.reconstruction.enabled:
        end = b.reconstruction(t, block_size)
        phases["reconstruction"] = (t, end)
        t = end + sc.phase_gap_s
    if sc.capacity.enabled:
        end, n_prime = b.capacity(t, capacity_tokens)
        phases["capacity"] = (t, end)
    order = sorted(range(len(b.requests)), key=lambda i: b.requests[i].arrival)  # stable: ties keep build order
    return PartyPlan([b.requests[i] for i in order], b.probes, phases, victim_tenant, n_prime)

"""Synthetic tool-using agent sessions (mirrors a coding agent's loop, as Claude Code renders it).

Every session starts with one shared prompt -- ``tool_tokens`` of tool schemas then
``system_prompt_tokens`` of system prompt, the same ids for all sessions (as Claude Code renders
tools, then system) -- followed by an initial user context. Each step is one request; its output
(a tool call, given as ``output_token_ids``) and then the tool result are appended to the
trajectory, so step ``i + 1``'s prompt extends step ``i``'s prompt and answer::

    SHARED [user hdr] CONTEXT <eot> ( [assistant hdr] CALL_j <eot> [tool hdr] RESULT_j <eot> )_{j<i}
    [assistant hdr]

When the next prompt plus output would exceed ``max_context_tokens`` the trajectory is compacted:
it is replaced by a fresh summary of ``summary_tokens`` (the shared prompt survives). With
probability ``subagent_probability`` a step spawns a sub-agent: its own shared prompt
(``subagent_prompt_tokens``, the same for all sub-agents), a fresh task, ``subagent_steps`` steps
of the same loop (sub-agents do not spawn sub-agents); the parent's next step arrives after the
sub-agent's last one, and its tool result has the length of the sub-agent's last answer.

Defaults come from the coding-agent trace (``workloads.agent_stats`` on
``shared/traces/weka_agent_sample``: 24 sessions, 1,343 requests): tools median 12,350 tokens,
system median 2,872; steps per session median 28 / p90 149; first input median 56,892 / p90
220,691 tokens (minus the shared prompt: the initial context); per-step growth median 259 / p90
3,494; output median 231 / p90 945; time between step arrivals median 19 s / p90 118 s; 72 of
1,319 steps reset the context; no sub-agents in the sample (so they are off by default).

Timing is open-loop: step ``i + 1`` arrives ``step_gap`` after step ``i`` arrived. Session ``s``
draws from its own stream ``rng_for(seed, 3, s)``.

Invariants: a step's prompt extends the previous step's prompt and answer, except after a
compaction (the shared prompt survives it). Imports neither simpy nor torch.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from workloads.dists import Dist, lognormal, rng_for
from workloads.tokens import EOT, K_AGENT_SESSION, K_AGENT_SHARED, RunTokens, TokenSpace, header, region, run_ids
from workloads.trace_format import TraceRequest

TAG = 3


@dataclass(frozen=True)
class AgentParams:
    """Knobs of :func:`agent_sessions`; defaults from the coding-agent trace (module docstring)."""

    sessions: int = 20
    tool_tokens: int = 12350
    system_prompt_tokens: int = 2870
    initial_context_tokens: Dist = field(default_factory=lambda: lognormal(41000, 205000, 500, 180000))
    steps: Dist = field(default_factory=lambda: lognormal(28, 149, 1, 400))
    tool_result_tokens: Dist = field(default_factory=lambda: lognormal(259, 3494, 1, 100000))
    output_tokens: Dist = field(default_factory=lambda: lognormal(231, 945, 1, 8192))
    step_gap: Dist = field(default_factory=lambda: lognormal(19, 118, 0.5, 3600))
    max_context_tokens: int = 200000
    summary_tokens: int = 20000
    subagent_probability: float = 0.0
    subagent_prompt_tokens: int = 6000
    subagent_steps: Dist = field(default_factory=lambda: Dist("geometric", mean=8.0, max=100))
    subagent_task_tokens: Dist = field(default_factory=lambda: lognormal(500, 2000, 1, 20000))

    def __post_init__(self) -> None:
        if not 0 <= self.sessions < 1 << 24:
            raise ValueError("need 0 <= sessions < 2**24")
        if not 0.0 <= self.subagent_probability <= 1.0:
            raise ValueError("subagent_probability must be in [0, 1]")
        fixed = max(self.tool_tokens + self.system_prompt_tokens, self.subagent_prompt_tokens)
        if fixed + self.summary_tokens + 64 >= self.max_context_tokens:
            raise ValueError("max_context_tokens must exceed the shared prompt + summary_tokens + 64")


class _Loop:
    """One agent's trajectory (a parent or a sub-agent): prompt runs plus id allocation."""

    def __init__(self, shared: tuple[int, int], first: tuple[int, int], space: TokenSpace) -> None:
        self.shared = RunTokens.of(shared)
        self.space = space
        self.traj = RunTokens.of(header("user"), first, [EOT])

    def prompt(self) -> RunTokens:
        return RunTokens.of(self.shared, self.traj, header("assistant"))

    def compact(self, summary_tokens: int) -> None:
        self.traj = RunTokens.of(header("user"), self.space.fresh(summary_tokens), [EOT])

    def append(self, call: tuple[int, int], result_len: int) -> None:
        self.traj = RunTokens.of(self.traj, header("assistant"), call, [EOT], header("tool"),
                                 self.space.fresh(result_len), [EOT])


def _steps(p: AgentParams, rng: np.random.Generator, loop: _Loop, n_steps: int, t: float, rid: str,
           session: str, state: dict[str, float], *, parent: bool = True) -> Iterator[TraceRequest]:
    """``n_steps`` steps of ``loop`` from time ``t``; leaves the last arrival and answer in ``state``.
    Only a parent (``parent=True``) spawns sub-agents; sub-agents do not nest."""
    system_tokens = len(loop.shared)
    for k in range(n_steps):
        n_out = p.output_tokens.one_int(rng, at_least=1)
        prompt = loop.prompt()
        if len(prompt) + n_out + 1 > p.max_context_tokens:
            loop.compact(p.summary_tokens)
            prompt = loop.prompt()
            n_out = max(1, min(n_out, p.max_context_tokens - len(prompt) - 1))
        call = loop.space.fresh(n_out)
        output = np.concatenate([run_ids(call), np.array([EOT], dtype=np.int64)])
        yield TraceRequest(id=f"{rid}-{k}", arrival=t, tokens=prompt, output_tokens=n_out + 1,
                           output_token_ids=output, session=session, system_tokens=system_tokens)
        state["t"], state["answer"] = t, float(n_out)
        if k + 1 < n_steps:
            result = p.tool_result_tokens.one_int(rng, at_least=1)
            if parent and p.subagent_probability and rng.random() < p.subagent_probability:
                sub = _Loop((region(K_AGENT_SHARED, 1), p.subagent_prompt_tokens),
                            loop.space.fresh(p.subagent_task_tokens.one_int(rng, at_least=1)), loop.space)
                n_sub = p.subagent_steps.one_int(rng, at_least=1)
                state["subs"] = state.get("subs", 0.0) + 1
                sub_state: dict[str, float] = {}
                yield from _steps(p, rng, sub, n_sub, t + p.step_gap.one(rng),
                                  f"{rid}-sa{int(state['subs'])}", session, sub_state, parent=False)
                t, result = sub_state["t"], int(sub_state["answer"])
            loop.append(call, result)
            t += p.step_gap.one(rng)


def agent_session(p: AgentParams, seed: int, s: int) -> Iterator[TraceRequest]:
    """The requests of session ``s`` with arrivals relative to the session start."""
    rng = rng_for(seed, TAG, s)
    space = TokenSpace(region(K_AGENT_SESSION, s))
    shared_len = p.tool_tokens + p.system_prompt_tokens
    room = p.max_context_tokens - shared_len - 64 - p.output_tokens.one_int(rng, at_least=1)
    first = space.fresh(min(p.initial_context_tokens.one_int(rng, at_least=1), max(1, room)))
    loop = _Loop((region(K_AGENT_SHARED, 0), shared_len), first, space)
    n_steps = p.steps.one_int(rng, at_least=1)
    yield from _steps(p, rng, loop, n_steps, 0.0, f"agent-{s}", f"agent-{s}", {})


def agent_sessions(p: AgentParams, seed: int) -> Iterator[Iterator[TraceRequest]]:
    """All sessions, lazily, in session order."""
    for s in range(p.sessions):
        yield agent_session(p, seed, s)

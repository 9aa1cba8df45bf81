"""Synthetic multi-turn chat sessions (mirrors a chat client that resends the whole conversation).

Session ``s`` (its own random stream ``rng_for(seed, 1, s)``, so its content does not depend on
the arrival process or on other sessions) draws a number of turns from ``turns`` and a system
prompt out of ``system_prompts`` shared ones. Turn ``k`` of the session is one request whose
prompt is the whole conversation so far rendered with a Llama-3-style chat template::

    <bos> [system hdr] SYSTEM <eot> ( [user hdr] U_j <eot> [assistant hdr] A_j <eot> )_{j<k}
          [user hdr] U_k <eot> [assistant hdr]

and whose output is ``A_k <eot>``, given as ``output_token_ids`` -- so turn ``k + 1``'s prompt
starts with turn ``k``'s prompt plus the tokens the engine generated, and the engine hashes real
output blocks that the next turn can hit. Template tokens (headers, ``<eot>``) are the same ids in
every request. Content ids are fresh per message (``workloads.tokens``), so nothing is shared by
accident: sessions share exactly the system prompt (and the template tokens around it).

Timing: a session starts at its arrival (from the arrival process); turn ``k + 1`` arrives
``think_time`` seconds after turn ``k`` *arrived* (an open-loop replay: if the engine has not
finished turn ``k`` by then, turn ``k + 1`` cannot hit turn ``k``'s answer blocks yet). A session
ends early when the next turn's prompt plus output would exceed ``max_context_tokens``.
Invariants: ``system_tokens`` of every request is the rendered system block's length; prompts
never exceed ``max_context_tokens - output_tokens``.

Imports neither simpy nor torch.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from workloads.dists import Dist, lognormal, rng_for
from workloads.tokens import BOS, EOT, K_CHAT_SESSION, K_CHAT_SHARED, RunTokens, TokenSpace, header, region, run_ids
from workloads.trace_format import TraceRequest

TAG = 1


@dataclass(frozen=True)
class ChatParams:
    """Knobs of :func:`chat_sessions` (defaults: a short-answer assistant chat)."""

    sessions: int = 200
    turns: Dist = field(default_factory=lambda: Dist("geometric", mean=4.0, max=40))
    system_prompt_tokens: int = 300
    system_prompts: int = 1
    user_tokens: Dist = field(default_factory=lambda: lognormal(60, 300, 1, 4096))
    output_tokens: Dist = field(default_factory=lambda: lognormal(200, 600, 1, 2048))
    think_time: Dist = field(default_factory=lambda: Dist("exponential", mean=60.0))
    max_context_tokens: int = 32768

    def __post_init__(self) -> None:
        if self.sessions < 0 or self.system_prompt_tokens < 0 or self.system_prompts < 1:
            raise ValueError("need sessions >= 0, system_prompt_tokens >= 0, system_prompts >= 1")
        if self.sessions >= 1 << 24:
            raise ValueError("at most 2**24 - 1 sessions")


def chat_session(p: ChatParams, seed: int, s: int) -> Iterator[TraceRequest]:
    """The requests of session ``s`` with arrivals relative to the session start."""
    rng = rng_for(seed, TAG, s)
    n_turns = p.turns.one_int(rng, at_least=1)
    sys_run = (region(K_CHAT_SHARED, int(rng.integers(p.system_prompts))), p.system_prompt_tokens)
    history = RunTokens.of([BOS], header("system"), sys_run, [EOT])
    system_tokens = len(history)
    space = TokenSpace(region(K_CHAT_SESSION, s))
    sid = f"chat-{s}"
    t = 0.0
    for k in range(n_turns):
        user = space.fresh(p.user_tokens.one_int(rng, at_least=1))
        answer_len = p.output_tokens.one_int(rng, at_least=1)
        prompt = RunTokens.of(history, header("user"), user, [EOT], header("assistant"))
        if len(prompt) + answer_len + 1 > p.max_context_tokens:
            return
        answer = space.fresh(answer_len)
        output = np.concatenate([run_ids(answer), np.array([EOT], dtype=np.int64)])
        yield TraceRequest(
            id=f"{sid}-{k}", arrival=t, tokens=prompt, output_tokens=answer_len + 1,
            output_token_ids=output, session=sid, system_tokens=system_tokens,
        )
        history = RunTokens.of(prompt, answer, [EOT])
        t += max(0.0, p.think_time.one(rng))


def chat_sessions(p: ChatParams, seed: int) -> Iterator[Iterator[TraceRequest]]:
    """All sessions, lazily, in session order."""
    for s in range(p.sessions):
        yield chat_session(p, seed, s)

"""Small synthetic workloads: a few Zipf-popular shared prefixes (mirrors a fleet of clients with
fixed system prompts).

Invariants: a pure function of its arguments and seed. Imports neither simpy nor torch.
"""

from __future__ import annotations

import numpy as np

from sim.core import portable_math
from workloads.trace_format import TraceRequest


def shared_prefix(
    num_requests: int,
    *,
    num_prefixes: int = 4,
    prefix_tokens: int = 1024,
    suffix_tokens: int = 256,
    output_tokens: int = 64,
    rate: float = 10.0,
    zipf: float = 1.0,
    seed: int = 0,
    vocab_size: int = 128000,
    jitter: bool = True,
    suffixes_per_prefix: int | None = None,
) -> list[TraceRequest]:
    """Requests = one of ``num_prefixes`` shared random prefixes + a unique random suffix.

    Deterministic for ``seed`` (numpy PCG64). Prefix ``k`` (0-based) is chosen with probability
    proportional to ``(k + 1) ** -zipf`` (``zipf=0``: uniform). Arrivals form a Poisson process of
    ``rate`` per second (first arrival after one exponential gap). With ``jitter`` the suffix length
    is uniform on ``[suffix_tokens // 2, suffix_tokens * 3 // 2]``, else exactly ``suffix_tokens``.
    ``session`` records the prefix as ``"prefix-{k}"``. Ids are ``syn-{i}``.

    With ``suffixes_per_prefix = P`` every prefix has P fixed suffixes of exactly ``suffix_tokens``
    ("users", each asking the same question again -- inference-perf's ``shared_prefix`` data with
    ``num_prompts_per_group = P``): a request is a uniformly drawn user of its prefix, so the
    stream holds ``num_prefixes * P`` distinct prompts; ``session`` is ``"prefix-{k}/user-{u}"``.
    """
    if num_requests < 0:
        raise ValueError("num_requests must be >= 0")
    if num_prefixes < 1 or prefix_tokens < 0 or suffix_tokens < 0:
        raise ValueError("need num_prefixes >= 1, prefix_tokens >= 0, suffix_tokens >= 0")
    if prefix_tokens + (suffix_tokens // 2 if jitter else suffix_tokens) < 1:
        raise ValueError("prompts would be empty: raise prefix_tokens or suffix_tokens")
    if output_tokens < 1 or rate <= 0 or zipf < 0 or vocab_size < 2:
        raise ValueError("need output_tokens >= 1, rate > 0, zipf >= 0, vocab_size >= 2")
    rng = np.random.Generator(np.random.PCG64(seed))
    prefixes = rng.integers(0, vocab_size, size=(num_prefixes, prefix_tokens), dtype=np.int64)
    weights = portable_math.power(np.arange(1, num_prefixes + 1, dtype=np.float64), -zipf)  # same on every host
    choice = rng.choice(num_prefixes, size=num_requests, p=weights / weights.sum())
    arrivals = np.cumsum(rng.exponential(1.0 / rate, size=num_requests))
    if suffixes_per_prefix is not None:
        return _users(rng, prefixes, choice, arrivals, suffixes_per_prefix, suffix_tokens, output_tokens, vocab_size)
    if jitter:
        lens = rng.integers(suffix_tokens // 2, suffix_tokens * 3 // 2 + 1, size=num_requests)
    else:
        lens = np.full(num_requests, suffix_tokens, dtype=np.int64)
    out: list[TraceRequest] = []
    for i in range(num_requests):
        k = int(choice[i])
        suffix = rng.integers(0, vocab_size, size=int(lens[i]), dtype=np.int64)
        out.append(
            TraceRequest(
                id=f"syn-{i}",
                arrival=float(arrivals[i]),
                tokens=np.concatenate([prefixes[k], suffix]),
                output_tokens=output_tokens,
                session=f"prefix-{k}",
            )
        )
    return out


def _users(rng: np.random.Generator, prefixes: np.ndarray, choice: np.ndarray, arrivals: np.ndarray, users: int,
           suffix_tokens: int, output_tokens: int, vocab_size: int) -> list[TraceRequest]:
    """The fixed-users variant of :func:`shared_prefix` (see its docstring)."""
    if users < 1:
        raise ValueError("suffixes_per_prefix must be >= 1")
    table = rng.integers(0, vocab_size, size=(len(prefixes), users, suffix_tokens), dtype=np.int64)
    who = rng.integers(0, users, size=len(choice))
    prompts: dict[tuple[int, int], np.ndarray] = {}
    out: list[TraceRequest] = []
    for i, (k, u) in enumerate(zip(choice.tolist(), who.tolist())):
        tokens = prompts.get((k, u))
        if tokens is None:
            tokens = prompts[(k, u)] = np.concatenate([prefixes[k], table[k, u]])
        out.append(TraceRequest(id=f"syn-{i}", arrival=float(arrivals[i]), tokens=tokens,
                                output_tokens=output_tokens, session=f"prefix-{k}/user-{u}"))
    return out

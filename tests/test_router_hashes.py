"""A replica's engine takes the prompt keys the router made (``RouterRequest.engine_hasher``) only
where they are the keys its own hasher makes: the request's block hashes are the same lists, on
the prompt and on every output block after it, as hashing alone; any difference in what fixes the
keys (algorithm, block size, seed, lookahead, tagged keys) falls back to the engine's hashing."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.cluster.router import AdoptedPromptHasher, RouterRequest
from sim.core.hashing import make_block_hasher
from sim.core.request import Request
from workloads.tokens import RunTokens
from workloads.trace_format import TraceRequest

ALGOS = ["fast", "sha256", "xxhash"]


def _trace(runs: list[tuple[int, int]], salt: str | None, planned: bool) -> TraceRequest:
    tokens = RunTokens(np.array([s for s, _ in runs]), np.array([n for _, n in runs]))
    outs = np.arange(7, 7 + 40, dtype=np.int64) if planned else None  # trace-given outputs: the chain goes on
    return TraceRequest("r", 0.0, tokens, 40, output_token_ids=outs, salt=salt)


def _engine_hashes(tr: TraceRequest, hasher: object, outputs: int) -> list[object]:
    r = Request(tr.id, tr.tokens, tr.output_tokens, cache_salt=tr.salt, output_token_ids=tr.output_token_ids,
                hasher=hasher)  # type: ignore[arg-type]
    first = list(r.block_hashes)  # the first lookup: the prompt
    r.append_planned_outputs(outputs)
    return [*first, "|", *r.block_hashes]


@settings(max_examples=60, deadline=None)
@given(runs=st.lists(st.tuples(st.integers(0, 500), st.integers(1, 70)), min_size=1, max_size=5),
       algo=st.sampled_from(ALGOS), bs=st.sampled_from([4, 16]), salt=st.sampled_from([None, "s"]),
       lookahead=st.sampled_from([0, 3]), planned=st.booleans(), outputs=st.integers(0, 40))
def test_adopted_prompt_keys_are_the_engines_own(runs, algo, bs, salt, lookahead, planned, outputs) -> None:
    tr = _trace(runs, salt, planned)
    rr = RouterRequest(tr, 0)
    router_hasher = make_block_hasher(algo, bs, 0, lookahead, True, False)
    engine_hasher = make_block_hasher(algo, bs, "0", lookahead, False, False)  # seed as hashed; resumed scan apart
    rr.hashes(router_hasher)
    adopted = rr.engine_hasher(engine_hasher)
    assert type(adopted) is AdoptedPromptHasher
    assert _engine_hashes(tr, adopted, outputs) == _engine_hashes(tr, engine_hasher, outputs)


@pytest.mark.parametrize("other", [dict(algo="sha256"), dict(bs=32), dict(seed=1), dict(lookahead=2),
                                   dict(tagged=True)])
def test_a_hasher_that_hashes_otherwise_hashes_itself(other: dict) -> None:
    p = dict(algo="fast", bs=16, seed=0, lookahead=0, tagged=False)
    rr = RouterRequest(_trace([(0, 100)], None, False), 0)
    rr.hashes(make_block_hasher(p["algo"], p["bs"], p["seed"], p["lookahead"], True, p["tagged"]))
    p.update(other)
    engine_hasher = make_block_hasher(p["algo"], p["bs"], p["seed"], p["lookahead"], True, p["tagged"])
    assert rr.engine_keys(engine_hasher) is None and rr.engine_hasher(engine_hasher) is engine_hasher


def test_a_first_lookup_after_outputs_hashes_everything_itself() -> None:
    """The prompt's keys answer only a first call on the bare prompt."""
    tr = _trace([(0, 100)], None, True)
    rr = RouterRequest(tr, 0)
    hasher = make_block_hasher("fast", 16)
    rr.hashes(hasher)
    adopted = rr.engine_hasher(hasher)
    r = Request(tr.id, tr.tokens, tr.output_token_ids.size, output_token_ids=tr.output_token_ids, hasher=adopted)
    r.append_output_token_ids(list(range(7, 7 + 30)))  # outputs before the first lookup
    plain = Request(tr.id, tr.tokens, 40, output_token_ids=tr.output_token_ids, hasher=hasher)
    plain.append_output_token_ids(list(range(7, 7 + 30)))
    assert r.block_hashes == plain.block_hashes and len(r.block_hashes) == (100 + 30) // 16

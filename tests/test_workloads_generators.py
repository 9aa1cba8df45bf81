"""Synthetic generators: chat, RAG, agent -- structure, determinism and knobs."""

import collections

import numpy as np
import pytest

from sim.core.request import token_array
from workloads.agent import AgentParams, agent_session
from workloads.bounds import infinite_cache_hit_bound
from workloads.chat import ChatParams, chat_session, chat_sessions
from workloads.dists import Dist
from workloads.rag import RagParams, rag_requests
from workloads.tokens import BOS, EOT, header


def _tok(r):
    return token_array(r.tokens)


# -- chat -------------------------------------------------------------------------------------
def test_chat_turn_contains_history_and_answer():
    p = ChatParams(sessions=1, turns=Dist.fixed(4), think_time=Dist.fixed(30.0))
    turns = list(chat_session(p, 0, 0))
    assert [t.arrival for t in turns] == [0.0, 30.0, 60.0, 90.0]
    for a, b in zip(turns, turns[1:]):
        ta, tb = _tok(a), _tok(b)
        expected_head = np.concatenate([ta, a.output_token_ids])
        assert np.array_equal(tb[: expected_head.size], expected_head)  # prompt + answer, then new user turn
        assert tb[expected_head.size: expected_head.size + 4].tolist() == header("user")
    first = _tok(turns[0])
    assert first[0] == BOS and first[1:5].tolist() == header("system")
    assert first[-4:].tolist() == header("assistant")
    assert turns[0].system_tokens == 1 + 4 + p.system_prompt_tokens + 1 and first[turns[0].system_tokens - 1] == EOT
    for t in turns:
        assert t.output_token_ids[-1] == EOT and len(t.output_token_ids) == t.output_tokens
        assert t.session == "chat-0"


def test_chat_sessions_share_only_the_system_prompt():
    p = ChatParams(sessions=2, turns=Dist.fixed(1))
    a, b = (list(s)[0] for s in chat_sessions(p, 5))
    ta, tb = _tok(a), _tok(b)
    n = a.system_tokens
    assert np.array_equal(ta[:n], tb[:n]) and ta[n + 4] != tb[n + 4]


def test_chat_deterministic_and_max_context():
    p = ChatParams(sessions=3)
    one = [(r.id, r.arrival, _tok(r).tolist()) for s in chat_sessions(p, 11) for r in s]
    two = [(r.id, r.arrival, _tok(r).tolist()) for s in chat_sessions(p, 11) for r in s]
    other = [(r.id, r.arrival, _tok(r).tolist()) for s in chat_sessions(p, 12) for r in s]
    assert one == two and one != other
    small = ChatParams(sessions=20, turns=Dist.fixed(30), max_context_tokens=3000)
    for s in chat_sessions(small, 0):
        for r in s:
            assert len(r.tokens) + r.output_tokens <= 3000


def test_chat_bound_counts_answer_blocks():
    p = ChatParams(sessions=10, turns=Dist.fixed(3))
    reqs = [r for s in chat_sessions(p, 1) for r in s]
    with_out = infinite_cache_hit_bound(reqs, 16)
    prompt_only = infinite_cache_hit_bound(reqs, 16, include_outputs=False)
    assert with_out > prompt_only > 0  # later turns hit earlier answers' blocks


# -- RAG --------------------------------------------------------------------------------------
def test_rag_structure_and_popularity():
    p = RagParams(requests=400, corpus_size=50, top_k=4, zipf=1.2, system_prompt_tokens=100)
    reqs = list(rag_requests(p, 3))
    sys_len = reqs[0].system_tokens
    assert sys_len == 1 + 4 + 100 + 1
    heads = {tuple(_tok(r)[:sys_len]) for r in reqs}
    assert len(heads) == 1  # one shared system prompt
    docs = collections.Counter()
    for r in reqs:
        t = _tok(r)
        marks = np.flatnonzero(t == t[sys_len + 4])  # the <doc> marker id
        assert marks.size == 4
        first_ids = [int(t[m + 1]) for m in marks]
        assert len(set(first_ids)) == 4  # distinct documents
        docs.update(first_ids)
        assert t[-4:].tolist() == header("assistant")
    counts = sorted(docs.values(), reverse=True)
    assert counts[0] > 5 * counts[-1]  # Zipf popularity


def test_rag_doc_order_matters():
    base = dict(requests=600, corpus_size=20, top_k=3, zipf=1.0)
    rel = infinite_cache_hit_bound(rag_requests(RagParams(**base), 0), 16)
    canon = infinite_cache_hit_bound(rag_requests(RagParams(**base, doc_order="canonical"), 0), 16)
    assert canon > rel > 0
    a = [_tok(r).tolist() for r in rag_requests(RagParams(**base), 9)]
    assert a == [_tok(r).tolist() for r in rag_requests(RagParams(**base), 9)]
    with pytest.raises(ValueError):
        RagParams(top_k=10, corpus_size=5)


def test_rag_extreme_skew_still_distinct():
    reqs = list(rag_requests(RagParams(requests=5, corpus_size=6, top_k=6, zipf=30.0), 0))
    assert all(len(r.tokens) > 0 for r in reqs)


# -- agent ------------------------------------------------------------------------------------
def _small_agent(**kw):
    base = dict(sessions=2, tool_tokens=500, system_prompt_tokens=100, initial_context_tokens=Dist.fixed(300),
                steps=Dist.fixed(8), tool_result_tokens=Dist.fixed(50), output_tokens=Dist.fixed(20),
                step_gap=Dist.fixed(10.0), max_context_tokens=2000, summary_tokens=200, subagent_prompt_tokens=64)
    base.update(kw)
    return AgentParams(**base)


def test_agent_steps_extend_and_compact():
    p = _small_agent(steps=Dist.fixed(20))
    reqs = list(agent_session(p, 0, 0))
    assert [r.arrival for r in reqs] == [10.0 * k for k in range(20)]
    compactions = 0
    for a, b in zip(reqs, reqs[1:]):
        ta, tb = _tok(a), _tok(b)
        assert np.array_equal(ta[:600], tb[:600])  # the shared tools + system prompt always survives
        head = np.concatenate([ta, a.output_token_ids])
        if np.array_equal(tb[: head.size], head):
            assert len(tb) == head.size + 4 + 50 + 1 + 4  # + tool hdr, result, eot, assistant hdr
        else:
            compactions += 1
    assert compactions >= 1 and all(len(r.tokens) + r.output_tokens <= 2000 for r in reqs)
    other = list(agent_session(p, 0, 1))
    assert np.array_equal(_tok(reqs[0])[:600], _tok(other[0])[:600])
    assert not np.array_equal(_tok(reqs[0])[600:700], _tok(other[0])[600:700])


def test_agent_subagents():
    p = _small_agent(subagent_probability=1.0, subagent_steps=Dist.fixed(2), subagent_prompt_tokens=64,
                     subagent_task_tokens=Dist.fixed(30), steps=Dist.fixed(3), max_context_tokens=100000)
    reqs = list(agent_session(p, 0, 0))
    ids = [r.id for r in reqs]
    assert ids == ["agent-0-0", "agent-0-sa1-0", "agent-0-sa1-1", "agent-0-1", "agent-0-sa2-0", "agent-0-sa2-1",
                   "agent-0-2"]
    assert [r.arrival for r in reqs] == [0.0, 10.0, 20.0, 30.0, 40.0, 50.0, 60.0]
    sub = [r for r in reqs if "-sa" in r.id]
    assert all(r.system_tokens == 64 for r in sub) and len({tuple(_tok(r)[:64]) for r in sub}) == 1
    assert all(r.session == "agent-0" for r in reqs)


def test_agent_defaults_follow_trace_statistics():
    p = AgentParams()
    assert (p.tool_tokens, p.system_prompt_tokens) == (12350, 2870)
    rng = np.random.default_rng(0)
    out = p.output_tokens.sample(rng, 40000)
    assert abs(np.median(out) - 231) < 8 and abs(np.percentile(out, 90) - 945) < 40
    with pytest.raises(ValueError):
        AgentParams(max_context_tokens=10000)

"""Trace loaders: RAGPulse, coding-agent sessions, Azure 2023, Mooncake skipping.

Published facts: RAGPulse token-weighted bound at block 16 = 0.314; the Mooncake facts (0.366,
0.640) are asserted in test_mooncake.py and, through configs, in test_workloads_registry.py.
"""

import json
import shutil

import numpy as np
import pytest

from sim.core.request import token_array
from workloads.agent_sessions import AgentTraceLoader, iter_sessions
from workloads.agent_stats import agent_trace_statistics
from workloads.azure import azure_times, load_azure, parse_timestamp
from workloads.bounds import hit_bounds, infinite_cache_hit_bound
from workloads.errors import SkipLog
from workloads.mooncake import load_mooncake
from workloads.paths import shared_traces_dir
from workloads.ragpulse import TABLES, load_ragpulse
from workloads.trace_format import TraceFormatError

TRACES = shared_traces_dir()
needs_traces = pytest.mark.skipif(not (TRACES / "ragpulse").is_dir(), reason="shared traces not present")


# -- RAGPulse ---------------------------------------------------------------------------------
@needs_traces
def test_ragpulse_published_bound_and_shape():
    reqs = list(load_ragpulse(TRACES / "ragpulse"))
    assert len(reqs) == 7106
    assert all(a.arrival <= b.arrival for a, b in zip(reqs, reqs[1:]))  # sorted (the file is not)
    assert abs(infinite_cache_hit_bound(reqs, 16) - 0.314) < 0.0005
    first = json.loads((TRACES / "ragpulse" / "0_trace.jsonl").open().readline())
    r0 = next(r for r in reqs if r.id == "rp-0")
    assert len(r0.tokens) == first["input_length"] and r0.session == first["session_id"]
    assert r0.output_tokens == first["output_length"]


def _ragpulse_dir(tmp_path, rows, extra_tables=None):
    d = tmp_path / "rp"
    d.mkdir()
    lengths = {"sys_prompt": {100: 20, 101: 7}, "passages_ids": {0: 30, 1: 16}, "history": {200: 5},
               "user_input": {300: 3}, "web_search": {400: 9}}
    for comp, (fname, key) in TABLES.items():
        lines = [json.dumps({key: k, "token_length": v}) for k, v in lengths[comp].items()]
        lines += (extra_tables or {}).get(comp, [])
        (d / fname).write_text("\n".join(lines) + "\n\n")
    (d / "0_trace.jsonl").write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    return d


def _rp_row(ts="5", ids=None, n_in=80):
    ids = ids or {"sys_prompt": [100, 101], "passages_ids": [1, 0], "history": [], "web_search": [],
                  "user_input": [300]}
    return {"timestamp": ts, "input_length": n_in, "output_length": 4, "session_id": "s", "hash_ids": ids}


def test_ragpulse_reblocking_exact(tmp_path):
    d = _ragpulse_dir(tmp_path, [_rp_row(ts="9"), _rp_row(ts="2", n_in=86)])
    a, b = list(load_ragpulse(d))
    assert (a.id, a.arrival, b.id) == ("rp-1", 2.0, "rp-0")  # sorted by timestamp
    ta, tb = token_array(a.tokens), token_array(b.tokens)
    assert len(ta) == 86 and len(tb) == 80 and a.system_tokens == 27
    # components 20 + 7 (sys), 16 + 30 (passages 1, 0), 3 (user): each its own run of ids
    assert np.array_equal(ta[:76], tb[:76])  # same components, same ids
    assert np.array_equal(ta[76:80], tb[76:80])  # template tokens (last) are shared ids too
    starts = [0, 20, 27, 43, 73]
    assert all(ta[s + 1] == ta[s] + 1 for s in starts) and all(ta[s] != ta[s - 1] + 1 for s in starts[1:])
    one = list(load_ragpulse(d, limit=1))
    assert [r.id for r in one] == ["rp-1"]


@pytest.mark.parametrize("row, field, problem", [
    ({**_rp_row(), "timestamp": "x"}, "timestamp", "expected a finite number"),
    ({**_rp_row(), "input_length": 3}, "input_length", "less than the summed component lengths"),
    ({**_rp_row(), "output_length": 0}, "output_length", "expected int >= 1"),
    (_rp_row(ids={"sys_prompt": [999], "passages_ids": [], "history": [], "web_search": [], "user_input": []}),
     "hash_ids.sys_prompt", "id 999 at index 0 is not in 1_sys_prompt.jsonl"),
    (_rp_row(ids={"sys_prompt": [], "passages_ids": ["a"], "history": [], "web_search": [], "user_input": []}),
     "hash_ids.passages_ids", "expected int"),
    (_rp_row(ids={"sys_prompt": [], "passages_ids": [], "history": [], "web_search": []}),
     "hash_ids.user_input", "missing required component"),
    ({k: v for k, v in _rp_row().items() if k != "session_id"}, "session_id", "missing required field"),
])
def test_ragpulse_errors_and_skip(tmp_path, row, field, problem):
    d = _ragpulse_dir(tmp_path, [_rp_row(), row])
    with pytest.raises(TraceFormatError) as info:
        load_ragpulse(d)
    assert (info.value.line, info.value.field) == (2, field) and problem in str(info.value)
    assert str(info.value).startswith(f"{d / '0_trace.jsonl'}:2: field '{field}'")
    log = SkipLog(with_file=True)
    assert len(list(load_ragpulse(d, skip_bad_lines=True, skip_log=log))) == 1
    assert log.skipped == 1 and log.skipped_lines == ["0_trace.jsonl:2"]


def test_ragpulse_table_errors(tmp_path):
    d = _ragpulse_dir(tmp_path, [_rp_row()], {"history": ['{"history_id": 5, "token_length": 600}', "{oops"]})
    with pytest.raises(TraceFormatError, match=r"3_history.jsonl:2: field 'token_length'"):
        load_ragpulse(d)
    log = SkipLog(with_file=True)
    list(load_ragpulse(d, skip_bad_lines=True, skip_log=log))
    assert log.skipped == 2 and log.skipped_lines == ["3_history.jsonl:2", "3_history.jsonl:3"]


# -- coding-agent sessions --------------------------------------------------------------------
@needs_traces
def test_agent_trace_blocks_match_ids():
    """At the trace's block size 64, with private prompts, the token bound equals an id computation."""
    folder = TRACES / "weka_agent_sample"
    loader = AgentTraceLoader(shared_prompt_fraction=0.0)
    sessions = list(iter_sessions(folder, loader, max_sessions=6))
    reqs = [r for s in sessions for r in s]
    hit = total = 0
    for path in sorted(folder.glob("*.json"))[:6]:
        seen: set[int] = set()
        for r in json.loads(path.read_text())["requests"]:
            total += r["in"]
            k = 0
            for h in r["hash_ids"][: (r["in"] - 1) // 64]:
                if h not in seen:
                    break
                k += 1
            hit += 64 * k
            seen.update(r["hash_ids"])
    assert len(reqs) == sum(len(json.loads(p.read_text())["requests"]) for p in sorted(folder.glob("*.json"))[:6])
    assert all(len(r.tokens) == r_in for r, r_in in zip(reqs, _ins(folder, 6)))
    assert infinite_cache_hit_bound(reqs, 64, include_outputs=False) == pytest.approx(hit / total, abs=1e-12)
    # the shared prompt adds cross-session hits, never removes any
    shared = [r for s in iter_sessions(folder, AgentTraceLoader(), max_sessions=6) for r in s]
    assert infinite_cache_hit_bound(shared, 64) > hit / total
    assert max(r.num_runs for r in (q.tokens for q in shared)) < 200  # compact prompts


def _ins(folder, n):
    return [r["in"] for p in sorted(folder.glob("*.json"))[:n] for r in json.loads(p.read_text())["requests"]]


@needs_traces
def test_agent_trace_statistics():
    s = agent_trace_statistics(TRACES / "weka_agent_sample")
    assert (s["sessions"], s["requests"], s["subagents"], s["context_resets"]) == (24, 1343, 0, 72)
    assert s["tool_tokens"]["p50"] == pytest.approx(12350.5) and s["output_tokens"]["p50"] == 231


def _agent_doc(requests, **top):
    return {"id": "sess", "block_size": 4, "hash_id_scope": "local", "tool_tokens": 3, "system_tokens": 2,
            "requests": requests, **top}


def _agent_req(t, n_in, ids, out=2):
    return {"t": t, "type": "n", "in": n_in, "out": out, "hash_ids": ids, "think_time": 1.0}


def test_agent_session_tokens_subagents_and_clamp(tmp_path):
    doc = _agent_doc([
        _agent_req(0.0, 10, [1, 2]),
        {"type": "subagent", "t": 1.0, "system_tokens": 4,
         "requests": [_agent_req(0.0, 9, [7, 8]), _agent_req(2.0, 8, [7, 9], out=0)]},
        _agent_req(5.0, 14, [1, 2, 3]),
        _agent_req(6.0, 11, [1, 2]),
    ])
    (tmp_path / "a.json").write_text(json.dumps(doc))
    loader = AgentTraceLoader()
    (reqs,) = list(iter_sessions(tmp_path, loader))
    assert [(r.id, r.arrival) for r in reqs] == [("sess-0", 0.0), ("sess-sa1-1", 1.0), ("sess-sa1-2", 3.0),
                                                 ("sess-3", 5.0), ("sess-4", 6.0)]
    assert loader.clamped_outputs == 1 and reqs[2].output_tokens == 1
    p0, s1, s2, p3, p4 = (token_array(r.tokens) for r in reqs)
    assert np.array_equal(p0[:8], p4[:8]) and not set(p0[8:]) & set(p4[8:])  # tails unique per request
    assert len(p0) == 10 and len(p3) == 14 and p0[:5].tolist() == p3[:5].tolist()  # shared 3 + 2 tokens
    assert np.array_equal(p0[:8], p3[:8])  # same ids 1, 2
    assert p0[8] != p3[8]  # p0's tail has no id: unique to the request
    assert s1[:4].tolist() == p0[:4].tolist()  # sub-agent shares only its own 0 + 4 prompt tokens
    assert reqs[0].system_tokens == 5 and reqs[1].system_tokens == 4
    private = list(iter_sessions(tmp_path, AgentTraceLoader(shared_prompt_fraction=0.0)))[0]
    assert token_array(private[0].tokens)[0] != p0[0]


@pytest.mark.parametrize("mutate, field", [
    (lambda d: d["requests"][1].update({"in": "x"}), "requests[1].in"),
    (lambda d: d["requests"][1].update({"hash_ids": [1]}), "requests[1].hash_ids"),
    (lambda d: d["requests"][1].pop("t"), "requests[1].t"),
    (lambda d: d["requests"][1].update({"out": -1}), "requests[1].out"),
    (lambda d: d["requests"][1].update({"hash_ids": [1, 2.5, 3]}), "requests[1].hash_ids"),
])
def test_agent_session_errors_and_skip(tmp_path, mutate, field):
    doc = _agent_doc([_agent_req(0.0, 10, [1, 2]), _agent_req(5.0, 14, [1, 2, 3]), _agent_req(9.0, 4, [1])])
    mutate(doc)
    (tmp_path / "b.json").write_text(json.dumps(doc))
    with pytest.raises(TraceFormatError) as info:
        list(iter_sessions(tmp_path, AgentTraceLoader()))
    assert info.value.field == field and str(info.value).startswith(f"{tmp_path / 'b.json'}:1: field '{field}'")
    loader = AgentTraceLoader(skip_bad_lines=True)
    (reqs,) = list(iter_sessions(tmp_path, loader))
    assert len(reqs) == 2 and loader.log.skipped == 1


def test_agent_file_level_errors(tmp_path):
    (tmp_path / "a.json").write_text("{not json")
    (tmp_path / "b.json").write_text(json.dumps(_agent_doc([_agent_req(0.0, 10, [1, 2])], block_size=0)))
    with pytest.raises(TraceFormatError, match=r"a\.json:1: malformed JSON"):
        list(iter_sessions(tmp_path, AgentTraceLoader()))
    loader = AgentTraceLoader(skip_bad_lines=True)
    assert list(iter_sessions(tmp_path, loader)) == [[], []]
    assert loader.log.skipped == 2 and loader.log.skipped_lines == ["a.json:1", "b.json:1"]
    with pytest.raises(FileNotFoundError):
        list(iter_sessions(tmp_path / "nothing", loader))


# -- Azure 2023 -------------------------------------------------------------------------------
def test_azure_parse_and_errors(tmp_path):
    assert parse_timestamp("2023-11-16 18:17:04.0319600") - parse_timestamp("2023-11-16 18:17:03.9799600") \
        == pytest.approx(0.052, abs=1e-6)
    assert parse_timestamp("1970-01-02 00:00:01") == 86401.0
    p = tmp_path / "a.csv"
    p.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:00:00.5,10,3\n"
                 "2023-11-16 18:00:02.5,5,0\n2023-11-16 18:00:03.5,7,2\nbad-time,1,1\n")
    with pytest.raises(TraceFormatError, match=r"a\.csv:3: field 'GeneratedTokens': expected int >= 1"):
        list(load_azure(p))
    log = SkipLog()
    reqs = list(load_azure(p, skip_bad_lines=True, skip_log=log))
    assert log.skipped == 2 and log.skipped_lines == [3, 5]
    got = [(r.id, r.arrival, len(r.tokens), r.output_tokens) for r in reqs]
    assert got == [("az-0", 0.0, 10, 3), ("az-1", 3.0, 7, 2)]
    assert not set(token_array(reqs[0].tokens)) & set(token_array(reqs[1].tokens))  # unique prompts
    assert azure_times(p, skip_bad_lines=True).tolist() == [0.0, 3.0]
    (tmp_path / "h.csv").write_text("time,in,out\n")
    with pytest.raises(TraceFormatError, match=r"h\.csv:1: expected header"):
        list(load_azure(tmp_path / "h.csv"))


@needs_traces
def test_azure_real_traces():
    code = azure_times(TRACES / "azure_llm_2023" / "AzureLLMInferenceTrace_code.csv")
    assert code.size == 8819 and code[0] == 0.0 and np.all(np.diff(code) >= 0) and 3400 < code[-1] < 3500
    reqs = list(load_azure(TRACES / "azure_llm_2023" / "AzureLLMInferenceTrace_conv.csv", limit=300))
    assert len(reqs) == 300 and hit_bounds(reqs, [16])[16] == 0.0


# -- Mooncake: skipping bad lines -------------------------------------------------------------
def test_mooncake_skip_bad_lines(tmp_path):
    row = {"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [0, 1]}
    lines = [json.dumps(row), "{bad", json.dumps({**row, "output_length": 0}), json.dumps({**row, "timestamp": 9})]
    p = tmp_path / "m.jsonl"
    p.write_text("\n".join(lines) + "\n")
    with pytest.raises(TraceFormatError, match=r"m\.jsonl:2: malformed JSON"):
        list(load_mooncake(p))
    log = SkipLog()
    reqs = list(load_mooncake(p, skip_bad_lines=True, skip_log=log))
    assert [r.id for r in reqs] == ["mc-0", "mc-3"] and log.skipped == 2 and log.skipped_lines == [2, 3]
    assert log.first_error.startswith(f"{p}:2: malformed JSON")


def test_loaders_missing_paths(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_ragpulse(tmp_path)
    with pytest.raises(FileNotFoundError):
        load_azure(tmp_path / "x.csv")
    shutil.rmtree(tmp_path)

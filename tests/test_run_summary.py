"""What ``apcsim run`` tells a user: hit rates named for what they count, the offline bounds beside
them, the human summary and its diagnosis, ``--json`` as before, and the example trace."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest

from sim.analysis.diagnosis import SIGNIFICANT, diagnose, losses
from sim.cli.main import main
from sim.cli.summary import count, seconds, sig

ROOT = Path(__file__).resolve().parents[1]
MY_TRACE = ROOT / "configs" / "my_trace.yaml"
OLD_JSON_KEYS = ["num_requests", "num_steps", "token_hit_rate", "request_hit_rate", "num_preemptions", "ttft_p50_s",
                 "ttft_p90_s", "ttft_p99_s", "tpot_p50_s", "throughput_output_tokens_per_s", "sim_time_s"]


@pytest.fixture(scope="module")
def my_trace_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("my_trace") / "run"
    assert main(["run", str(MY_TRACE), "--out", str(out), "--no-progress"]) == 0
    return out


def test_example_trace_shows_each_caching_rule(my_trace_run):
    req = pd.read_parquet(my_trace_run / "requests.parquet").set_index("request_id")
    # bob: the 4 system-prompt blocks; alice-2: her first turn and answer (91 cached tokens -> 5 blocks);
    # carol-1: salted, nothing shared; dave: prompt_logprobs never reads; carol-2: carol-1's salted
    # system prompt; erin: a LoRA adapter is another namespace
    assert req["hit_tokens"].to_dict() == {"alice-1": 0, "bob-1": 64, "alice-2": 80, "carol-1": 0, "dave-1": 0,
                                           "carol-2": 64, "erin-1": 0}


def test_hit_rates_named_for_what_they_count(my_trace_run):
    s = json.loads((my_trace_run / "summary.json").read_text())
    req = pd.read_parquet(my_trace_run / "requests.parquet")
    assert s["first_admission_token_hit_rate"] == req["hit_tokens"].sum() / req["prompt_tokens"].sum()
    assert s["prefix_cache_hit_rate"] == s["prefix_cache"]["hits"] / s["prefix_cache"]["queries"]
    assert s["num_requests_with_hit"] == 3 and s["requests_with_hit_fraction"] == 3 / 7
    # the deprecated aliases keep their values
    assert s["token_hit_rate"] == s["prefix_cache_hit_rate"]
    assert s["request_hit_rate"] == s["first_admission_token_hit_rate"]


def test_summary_json_gains_engine_and_bounds(my_trace_run):
    s = json.loads((my_trace_run / "summary.json").read_text())
    assert s["engine"]["num_gpu_blocks"] > 8192 // 16 and s["engine"]["block_size"] == 16
    assert s["engine"]["max_model_len"] == 8192
    # one request at a time with a pool that never evicts, the engine reaches the infinite cache
    assert s["infinite_cache_hit_rate"] == pytest.approx(s["first_admission_token_hit_rate"])
    assert s["belady_hit_rate"] == s["lru_sequential_hit_rate"] == s["infinite_cache_hit_rate"]
    # without salt and LoRA, carol-1 and erin-1 would hit the system prompt too
    assert s["infinite_cache_hit_rate_shared"] == pytest.approx((208 + 128) / 630)
    assert (s["num_cache_salts"], s["num_lora_adapters"], s["num_prompt_logprobs_requests"]) == (1, 1, 1)
    assert "infinite_cache_hit_rate_block_16" not in s  # only for blocks larger than 16


def test_human_summary(tmp_path, capsys):
    assert main(["run", str(MY_TRACE), "--out", str(tmp_path / "r"), "--no-progress"]) == 0
    out = capsys.readouterr().out
    for text in ("7 requests; 630 prompt tokens", "max_model_len 8,192", "first admission (each request once)",
                 "infinite cache", "Belady, this pool", "vLLM 0.33.0 prefix_cache_hit_rate", "each admission: ",
                 "3 of 7 requests",
                 "0 evictions, 0 preemptions", "TTFT", "queue time", "diagnosis   isolation --",
                 "1 cache salt and 1 LoRA adapter"):
        assert text in out, text
    assert "{" not in out  # no JSON


def test_human_summary_names_what_was_not_served(tmp_path, capsys):
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"id": "a", "arrival": 0, "tokens": [1, 2, 3], "output_tokens": 2}\n'
                     '{"id": "b", "arrival": 0, "tokens": "oops", "output_tokens": 2}\n'
                     '{"id": "c", "arrival": 1, "tokens": [1, 2, 3, 4, 5, 6, 7, 8], "output_tokens": 2}\n')
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"name: t\nworkload: {{kind: trace, path: {trace}, skip_bad_lines: true}}\n"
                   "engine: {max_model_len: 8}\n")
    assert main(["run", str(cfg), "--out", str(tmp_path / "r"), "--no-progress", "--no-bounds"]) == 0
    out = capsys.readouterr().out
    assert "1 requests; 3 prompt tokens" in out  # c (8 tokens >= max_model_len) is rejected, b skipped
    assert "1 rejected (see reject_reason), 1 trace lines skipped" in out


def test_json_flag_prints_the_old_output(tmp_path, capsys):
    assert main(["run", str(MY_TRACE), "--out", str(tmp_path / "r"), "--no-progress", "--json", "--no-bounds"]) == 0
    captured = capsys.readouterr()
    assert list(json.loads(captured.out)) == OLD_JSON_KEYS  # stdout is the JSON document alone (issue 37)
    err = [line for line in captured.err.splitlines() if "not compiled" not in line]
    assert err[0] == f"wrote {tmp_path / 'r'}/" and err[-1].startswith("wall time ")
    s = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert "infinite_cache_hit_rate" not in s  # --no-bounds


def test_number_formats():
    assert [sig(x) for x in (0.025065, 0.216, 17.85, 262.7, 1329.8, 0.0)] == ["0.0251", "0.216", "17.9", "263",
                                                                             "1,330", "0"]
    assert [seconds(x) for x in (2.2163, 0.028949, 17.85, 0.0)] == ["2.22 s", "28.9 ms", "17.9 s", "0 s"]
    assert [count(x) for x in (999, 28_889, 13_732_944)] == ["999", "28.9 k", "13.7 M"]
    assert seconds(math.nan) == "n/a"


# -- the diagnosis ----------------------------------------------------------------------------------
BASE = {"prompt_tokens": 1000, "num_evictions": 0, "queue_time_p50_s": 0.01, "queue_time_p99_s": 0.1,
        "engine": {"block_size": 16, "enable_prefix_caching": True}}


def _s(h, inf, lru=None, bel=None, shared=None, fine=None, **kw):
    s = {**BASE, "first_admission_token_hit_rate": h, "infinite_cache_hit_rate": inf, **kw}
    s["lru_sequential_hit_rate"] = inf if lru is None else lru
    s["belady_hit_rate"] = inf if bel is None else bel
    s["infinite_cache_hit_rate_shared"] = inf if shared is None else shared
    if fine is not None:
        s["infinite_cache_hit_rate_block_16"] = fine
    return s


@pytest.mark.parametrize("summary, cause", [
    (_s(0.037, 0.216, lru=0.039, bel=0.151, num_evictions=818_756), "capacity"),  # the quickstart
    (_s(0.30, 0.90, lru=0.85), "overload"),
    (_s(0.30, 0.31, shared=0.80, num_cache_salts=4), "isolation"),
    (_s(0.09, 0.093, fine=0.249, engine={"block_size": 512}), "block_granularity"),
    (_s(0.20, 0.21), "workload"),
    (_s(0.20, 0.20 + SIGNIFICANT * 0.9, lru=0.20 + SIGNIFICANT * 0.9), "workload"),  # below the threshold
    (_s(0.0, 0.5, engine={"block_size": 16, "enable_prefix_caching": False}), "caching_off"),
])
def test_diagnosis_names_the_largest_loss(summary, cause):
    d = diagnose(summary)
    assert d.cause == cause, d
    assert d.line.startswith(cause.replace("_", " ") if cause != "caching_off" else "prefix caching is off")


def test_losses_add_up():
    s = _s(0.037, 0.216, lru=0.039, bel=0.151, shared=0.25, fine=0.23, engine={"block_size": 64},
           num_evictions=5)
    loss = losses(s)
    assert loss["capacity"] + loss["overload"] == pytest.approx(0.216 - 0.037)
    assert loss["overload"] == pytest.approx(0.002) and loss["isolation"] == pytest.approx(0.034)
    assert loss["block_granularity"] == pytest.approx(0.014) and loss["workload"] == pytest.approx(0.75)


def test_diagnosis_without_lru_reference_uses_evictions():
    s = _s(0.5, 0.8)
    s["lru_sequential_hit_rate"] = s["belady_hit_rate"] = math.nan  # a hybrid pool
    assert diagnose(s).cause == "overload"
    assert diagnose({**s, "num_evictions": 10}).cause == "capacity"


def test_diagnosis_reads_miss_attribution_when_present():
    s = {**_s(0.5, 0.9, lru=0.6), "miss_attribution": {"evicted": 150, "never_seen": 100, "salted": 250}}
    d = diagnose(s)
    assert d.cause == "salted" and "25.0 % of prompt tokens" in d.line
    assert d.losses == {"evicted": 0.15, "never_seen": 0.1, "salted": 0.25}


def test_diagnosis_without_bounds():
    d = diagnose({**BASE, "first_admission_token_hit_rate": 0.3})
    assert d.cause == "unknown" and "--no-bounds" in d.line


def test_granularity_reference_for_blocks_above_16(tmp_path):
    out = tmp_path / "bs64"
    assert main(["run", str(MY_TRACE), "--out", str(out), "--no-progress", "--set", "engine.block_size=64"]) == 0
    s = json.loads((out / "summary.json").read_text())
    # at block size 16 the example trace hits 208 of its 630 prompt tokens in an infinite cache
    assert s["infinite_cache_hit_rate_block_16"] == pytest.approx(208 / 630)
    assert s["infinite_cache_hit_rate"] <= s["infinite_cache_hit_rate_block_16"]
    assert s["engine"]["block_size"] == 64

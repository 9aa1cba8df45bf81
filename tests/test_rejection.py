"""Per-request rejection, like vLLM 0.25.1: a prompt too long for ``max_model_len`` or a
request that can never fit the pool is rejected alone, recorded with ``status`` /
``reject_reason``, counted in the summary, and the run goes on; ``replay.on_invalid_request:
error`` keeps the old strict behaviour."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from sim.cli.main import main
from sim.core.hashing import make_block_hasher
from sim.core.scheduler import CacheConfig, Scheduler, SchedulerConfig
from sim.replay import intake
from sim.replay.engine import Replay, ReplayError
from sim.replay.rejection import reject_reason
from sim.timing.latency import FixedLatency
from sim.timing.simulated_executor import SimulatedExecutor
from workloads.trace_format import TraceRequest


def _req(rid: str, arrival: float, n: int, out: int = 2, base: int = 0) -> TraceRequest:
    return TraceRequest(rid, arrival, np.arange(base, base + n, dtype=np.int64), out)


def _sched(num_blocks: int = 200, block_size: int = 16, max_model_len: int = 1024, **kw) -> Scheduler:
    cfg = SchedulerConfig(max_model_len=max_model_len, max_num_batched_tokens=max(2048, max_model_len), **kw)
    return Scheduler(cfg, CacheConfig(block_size, num_blocks), make_block_hasher("fast", block_size))


def _replay(reqs, sched, **kw):
    return Replay(sched, SimulatedExecutor(FixedLatency(0.01)), reqs, integrity_check=True, **kw).run()


def test_prompt_longer_than_max_model_len_is_rejected_alone():
    reqs = [_req("a", 0.0, 100), _req("long", 0.1, 1500, base=1000), _req("b", 0.2, 100)]
    res = _replay(reqs, _sched())
    df = res.requests.set_index("request_id")
    assert list(df["status"]) == ["finished", "rejected", "finished"]
    assert df.loc["long", "reject_reason"] == (
        "prompt_too_long: prompt of 1500 tokens, max_model_len 1024 (prompt + 1 output must fit)")
    assert df.loc["a", "reject_reason"] == df.loc["b", "reject_reason"] == ""
    assert np.isnan(df.loc["long", "ttft"]) and np.isnan(df.loc["long", "first_scheduled"])
    s = res.summary
    assert s["num_requests"] == 2 and s["num_rejected_requests"] == 1
    assert s["prompt_tokens"] == 200  # the rejected prompt is not counted


def test_prompt_exactly_max_model_len_is_rejected_as_vllm_does():
    """vLLM's _validate_prompt_len: the prompt plus at least one output token must fit."""
    res = _replay([_req("edge", 0.0, 1024), _req("ok", 0.0, 1023, base=5000)], _sched())
    assert list(res.requests["status"]) == ["rejected", "finished"]


def test_request_that_never_fits_the_pool_is_rejected_alone():
    # 9 blocks: 8 usable; 100 prompt + 40 outputs - 1 = 139 slots need 9 blocks of 16
    reqs = [_req("small", 0.0, 30), _req("big", 0.0, 100, out=40, base=100), _req("fits", 0.0, 100, out=29, base=300)]
    res = _replay(reqs, _sched(num_blocks=9))
    df = res.requests.set_index("request_id")
    assert df.loc["big", "status"] == "rejected"
    assert df.loc["big", "reject_reason"] == (
        "never_fits_pool: 139 KV slots (100 prompt + 39 output tokens) need 9 blocks of 16, the pool has 8 usable")
    assert df.loc["small", "status"] == df.loc["fits", "status"] == "finished"
    assert res.summary["num_rejected_requests"] == 1


def test_strict_mode_stops_at_the_invalid_request():
    with pytest.raises(ReplayError, match=r"request long: prompt_too_long"):
        _replay([_req("a", 0.0, 10), _req("long", 0.5, 2000)], _sched(), reject_invalid=False)


def _completes_without_the_check(monkeypatch, prompt: int, out: int, sched_kw: dict) -> bool:
    """Does a lone request of ``prompt`` / ``out`` tokens finish when nothing rejects it?"""
    monkeypatch.setattr(intake, "reject_reason", lambda tr, s: None)
    steps = [0]

    def on_step(_s):
        steps[0] += 1
        if steps[0] > 2000:  # a request preempting itself forever
            raise TimeoutError

    try:
        _replay([_req("r", 0.0, prompt, out=out)], _sched(**sched_kw), fast_forward=False, on_step=on_step)
        return True
    except (ReplayError, TimeoutError):
        return False
    finally:
        monkeypatch.undo()


@pytest.mark.parametrize("mode", [{}, {"async_scheduling": True}, {"scheduler_reserve_full_isl": False},
                                  {"enable_chunked_prefill": False}])
def test_never_fits_pool_is_exactly_the_requests_that_cannot_finish(monkeypatch, mode):
    """Rejected <=> the engine could not finish the request alone (exhaustive at the boundary)."""
    bs, blocks = 4, 5
    kw = {"num_blocks": blocks, "block_size": bs, "max_model_len": bs * (blocks + 2), **mode}
    checked = 0
    for prompt in range(1, bs * (blocks + 2)):
        for out in (1, 2, 3, 4, 5, 9, 100):
            reason = reject_reason(_req("r", 0.0, prompt, out=out), _sched(**kw))
            if reason is not None and reason.startswith("prompt_too_long"):
                continue
            assert (reason is None) == _completes_without_the_check(monkeypatch, prompt, out, kw), (prompt, out, reason)
            checked += 1
    assert checked > 100


SMALL = {
    "name": "rej",
    "engine": {"block_size": 16, "num_gpu_blocks": 400, "max_model_len": 512},
    "latency": {"kind": "fixed", "step_time_s": 0.01},
}


def _trace_config(tmp_path: Path, lengths: list[int], **replay) -> Path:
    trace = tmp_path / "t.jsonl"
    with trace.open("w") as fh:
        for i, n in enumerate(lengths):
            fh.write(json.dumps({"id": f"r{i}", "arrival": 0.1 * i, "tokens": list(range(1000 * i, 1000 * i + n)),
                                 "output_tokens": 3}) + "\n")
    cfg = {**SMALL, "workload": {"kind": "trace", "path": str(trace)}, "replay": replay}
    p = tmp_path / "exp.yaml"
    p.write_text(yaml.safe_dump(cfg))
    return p


def test_apcsim_run_rejects_alone_and_reports(tmp_path, capsys):
    p = _trace_config(tmp_path, [100, 600, 200])
    assert main(["run", str(p), "--no-progress", "--out", str(tmp_path / "o")]) == 0
    out = capsys.readouterr().out
    assert "2 requests replayed" in out and "1 rejected (see reject_reason)" in out
    req = pd.read_parquet(tmp_path / "o" / "requests.parquet")
    assert list(req["status"]) == ["finished", "rejected", "finished"]
    assert req["reject_reason"].iloc[1].startswith("prompt_too_long: prompt of 600 tokens, max_model_len 512")
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert summary["num_rejected_requests"] == 1 and summary["num_requests"] == 2


def test_on_invalid_request_error_keeps_the_strict_behaviour(tmp_path, capsys):
    p = _trace_config(tmp_path, [100, 600], on_invalid_request="error")
    assert main(["run", str(p), "--no-progress", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("apcsim: error: request r1: prompt_too_long: prompt of 600 tokens")
    assert not (tmp_path / "o").exists()

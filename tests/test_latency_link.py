"""The step-time models with the CPU offload tier's link, as vLLM 0.33.0's runtime composes them
(issue 33 item 4, "the roofline and fitted latency models include it"): transfers run on their own
streams beside the forward, so a step lasts what the latency model says; a flush
(``jobs_to_flush``) makes the step wait for its stores first (``handle_preemptions``); a load delays
its request -- reported no earlier than the next step's output, then admitted -- never the step; an
empty step while transfers are pending lasts until the first one it may report lands. The same
holds under the fitted model (whose calibration file gives the link) and the roofline (the link
from ``engine.offload_bandwidth_gb_s``). Every expected number is derived by hand in the comments.

Shared set-up: Llama-3-8B (2 MiB of KV per 16-token block), a 1 ms-per-block link
(2.097152 GB/s) unless said otherwise, sync scheduling, Mooncake-style traces of 16-token ids."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sim.core.executor import StepShape
from sim.experiment.config import ConfigError, config_from_dict
from sim.experiment.engine_description import resolve
from sim.experiment.kv_worker import build_kv_worker
from sim.experiment.run import engine_facts, replay_experiment
from sim.timing.roofline import RooflineLatency, load_gpu_spec, load_model_spec

MS_PER_BLOCK_GB_S = 2.097152  # 2,097,152 B per block / 1e9 B/s per GB/s: 1 ms per block


def _run(tmp_path: Path, trace: list[dict[str, Any]], num_gpu_blocks: int, latency: dict[str, Any],
         **engine: Any) -> Any:
    (tmp_path / "t.jsonl").write_text("".join(json.dumps(r) + "\n" for r in trace))
    cfg = config_from_dict({"name": "t", "model": "llama-3-8b", "gpu": "H100-SXM",
                            "engine": {"block_size": 16, "num_gpu_blocks": num_gpu_blocks, "max_model_len": 80,
                                       "max_num_batched_tokens": 256, "num_cpu_blocks": 100, **engine},
                            "latency": latency,
                            "workload": {"kind": "mooncake", "path": "t.jsonl", "tokens_per_id": 16}},
                           str(tmp_path / "t.yaml"), tmp_path)
    result, _ = replay_experiment(cfg, progress=False)
    return result


def _fitted(tmp_path: Path, gb_s: float, latency_s: float) -> dict[str, Any]:
    """A calibration file: 10 ms per step whatever its shape, and the link it measured."""
    (tmp_path / "m.json").write_text(json.dumps({
        "kind": "fitted_linear", "features": {"intercept": 0.010},
        "host_link": {"bandwidth_gb_s": gb_s, "latency_s": latency_s, "measured": "by hand"}}))
    return {"kind": "fitted", "path": "m.json"}


# r0 (4 blocks, 1 output token) finishes in step 0; its 4-block store is deferred to step 1's start.
# r1 arrives at 5 ms with another 4-block prompt: on a pool of 5 usable blocks it is given block 5
# and three of r0's freed blocks (tail first), which the pending store still reads -> the connector
# flushes that store in step 1, whose forward waits for it. r1's own store runs in step 2, an empty
# step (nothing left to schedule) that lasts until the store lands.
FLUSH = [{"timestamp": 0, "input_length": 64, "output_length": 1, "hash_ids": [0, 1, 2, 3]},
         {"timestamp": 5, "input_length": 64, "output_length": 1, "hash_ids": [10, 11, 12, 13]}]


def test_a_flush_makes_the_step_wait_for_its_stores_fitted_model(tmp_path: Path) -> None:
    res = _run(tmp_path, FLUSH, 6, _fitted(tmp_path, MS_PER_BLOCK_GB_S, 0.0005))
    # step 0: 10 ms; step 1: 4 blocks x 1 ms + 0.5 ms latency = 4.5 ms of flush, then 10 ms;
    # step 2 (empty): r1's 4-block store, submitted at its start, lands 4.5 ms later
    assert list(res.steps["duration"]) == pytest.approx([0.010, 0.0145, 0.0045])
    assert res.summary["cpu_tier"]["flush_wait_s"] == pytest.approx(0.0045)  # the 0.5 ms: the file's latency


def test_a_flush_makes_the_step_wait_for_its_stores_roofline(tmp_path: Path) -> None:
    res = _run(tmp_path, FLUSH, 6, {"kind": "roofline"}, offload_bandwidth_gb_s=MS_PER_BLOCK_GB_S)
    # both forwards are a 64-token cold prefill of one sequence: 64 * 65 / 2 = 2080 attention pairs;
    # the roofline prices it (memory-bound: ~15 GB of weights / (3.35 TB/s * 0.8) = 5.6 ms, + 4 ms
    # overhead); the engine key's link has no latency: the flush is 4 blocks x 1 ms = 4 ms
    r = RooflineLatency(load_model_spec("llama-3-8b"), load_gpu_spec("H100-SXM")).step_time(
        StepShape(1, 0, 64, 64, 0, 2080))
    assert 0.009 < r < 0.010
    assert list(res.steps["duration"]) == pytest.approx([r, r + 0.004, 0.004])


# r0 computes a 4-block prompt; r1 (3 blocks, long decode) keeps the engine stepping every 10 ms;
# r2 repeats r0's prompt: the GPU hit stops at num_tokens - 1 (3 blocks, 48 tokens), the CPU
# lookup is bounded by num_tokens, so r2 loads the last block from the CPU tier (16 tokens).
def _load_trace(r1_outputs: int, r2_arrival_ms: int) -> list[dict[str, Any]]:
    return [{"timestamp": 0, "input_length": 64, "output_length": 1, "hash_ids": [0, 1, 2, 3]},
            {"timestamp": 5, "input_length": 48, "output_length": r1_outputs, "hash_ids": [10, 11, 12]},
            {"timestamp": r2_arrival_ms, "input_length": 64, "output_length": 2, "hash_ids": [0, 1, 2, 3]}]


def _request(res: Any, rid: str) -> Any:
    return res.requests.set_index("request_id").loc[rid]


def test_a_load_delays_its_request_not_the_step(tmp_path: Path) -> None:
    res = _run(tmp_path, _load_trace(10, 35), 12, _fitted(tmp_path, MS_PER_BLOCK_GB_S, 0.0005))
    busy = res.steps[res.steps["scheduled_tokens"] > 0]
    assert list(busy["duration"]) == pytest.approx([0.010] * len(busy))  # no step waits for the load
    r2 = _request(res, "mc-2")
    assert (r2.hit_tokens, r2.external_hit_tokens) == (48, 16)
    # r2 arrives at 35 ms; step 4 (40 ms) allocates its blocks and carries the 1-block load, which
    # lands at 41.5 ms but is reported in step 5's output (never in the carrying step's own); r2 is
    # admitted in step 6 (60 ms), computes its last prompt token and samples by 70 ms: TTFT 35 ms,
    # 2 steps waiting for KV (4 and 5)
    assert r2.ttft == pytest.approx(0.035) and r2.kv_wait_steps == 2


def test_a_slow_load_spans_steps_and_still_never_stretches_one(tmp_path: Path) -> None:
    # a 25 ms-per-block link (0.08388608 GB/s) + 0.5 ms: r0's store (4 blocks, 100.5 ms from 10 ms)
    # and r1's (3 blocks, 75.5 ms behind it) keep the shared link busy until 186 ms, so r2 comes at
    # 195 ms, when it is free (r1 decodes 30 tokens, to 310 ms)
    res = _run(tmp_path, _load_trace(30, 195), 12, _fitted(tmp_path, MS_PER_BLOCK_GB_S / 25, 0.0005))
    busy = res.steps[res.steps["scheduled_tokens"] > 0]
    assert list(busy["duration"]) == pytest.approx([0.010] * len(busy))
    r2 = _request(res, "mc-2")
    # step 20 (200 ms) carries the load, which lands at 225.5 ms: after step 21's end (220 ms), so it
    # is reported in step 22's output (230 ms); r2 is admitted in step 23 and samples by 240 ms:
    # TTFT 45 ms, 3 steps waiting for KV
    assert (r2.external_hit_tokens, r2.kv_wait_steps) == (16, 3)
    assert r2.ttft == pytest.approx(0.045)


@pytest.mark.parametrize(("duplex", "load_done_ms"), [(None, 145.5), (True, 145.5), (False, 211.5)])
def test_a_load_queues_behind_stores_only_with_a_shared_link(tmp_path: Path, duplex: bool | None,
                                                             load_done_ms: float) -> None:
    # a 25 ms-per-block link + 0.5 ms: r0's store (4 blocks) goes on at 10 ms and lands at 110.5 ms
    # (reported in step 11's output, 120 ms); r1's (3 blocks, submitted at 20 ms) waits behind it on
    # the store lane and lands at 186 ms. r2 arrives at 115 ms; step 12 (120 ms) carries its 1-block
    # load (25.5 ms) while r1's store is still on the link. Duplex (the default: vLLM's handler per
    # direction): it lands at 145.5 ms, in step 14 (140-150 ms): reported there, r2 admitted in step
    # 15, samples by 160 ms: TTFT 45 ms, 3 steps waiting (12-14). Shared: it waits for r1's store,
    # lands at 211.5 ms, reported in step 21 (220 ms), r2 samples by 230 ms: TTFT 115 ms, 10 steps.
    engine: dict[str, Any] = {} if duplex is None else {"offload_link_duplex": duplex}
    res = _run(tmp_path, _load_trace(30, 115), 12, _fitted(tmp_path, MS_PER_BLOCK_GB_S / 25, 0.0005), **engine)
    busy = res.steps[res.steps["scheduled_tokens"] > 0]
    assert list(busy["duration"]) == pytest.approx([0.010] * len(busy))  # no step waits for the link
    r2 = _request(res, "mc-2")
    assert r2.external_hit_tokens == 16
    report_end_ms = (load_done_ms // 10 + 1) * 10  # the end of the 10 ms step in which the load lands
    assert r2.ttft == pytest.approx((report_end_ms + 10 - 115) / 1000)
    assert r2.kv_wait_steps == report_end_ms // 10 - 12


def _cfg(tmp_path: Path, **engine: Any) -> Any:
    return config_from_dict({"name": "t", "model": "llama-3-8b", "gpu": "H100-SXM",
                             "engine": {"block_size": 16, "num_gpu_blocks": 9000, "max_model_len": 4096, **engine},
                             "workload": {"kind": "chat"}}, str(tmp_path / "t.yaml"), tmp_path)


def test_the_duplex_key_is_resolved_once_and_reported(tmp_path: Path) -> None:
    for value, duplex in ((None, True), (True, True), (False, False)):
        engine = {"num_cpu_blocks": 100} | ({} if value is None else {"offload_link_duplex": value})
        d = resolve(_cfg(tmp_path, **engine))
        worker = build_kv_worker(d)
        assert d.offload_link_duplex is duplex and worker is not None and worker.link.duplex is duplex
        tier = engine_facts(_cfg(tmp_path, **engine), d)["cpu_tier"]
        assert (tier["link_duplex"], tier["link_source"]) == (duplex, "gpu H100-SXM")
    assert "cpu_tier" not in engine_facts(_cfg(tmp_path), resolve(_cfg(tmp_path)))  # no tier, no link


def test_the_duplex_key_without_a_tier_is_one_config_error_line(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        _cfg(tmp_path, offload_link_duplex=False)
    msg = str(err.value)
    assert msg.startswith(f"{tmp_path / 't.yaml'}: engine: offload_link_duplex needs a CPU offload tier")
    assert "\n" not in msg

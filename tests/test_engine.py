"""The SimPy replay loop: timing semantics, metrics, and exact decode fast-forward."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from sim.core.config import CacheConfig, SchedulerConfig
from sim.core.executor import StepShape
from sim.core.hashing import make_block_hasher
from sim.core.scheduler import Scheduler
from sim.replay.engine import Replay, ReplayError
from sim.timing.latency import FixedLatency, LatencyModel
from sim.timing.simulated_executor import SimulatedExecutor
from workloads.trace_format import TraceRequest


def _sched(num_blocks: int = 1000, block_size: int = 16, algo: str = "fast", **kw) -> Scheduler:
    kw.setdefault("max_model_len", 4096)
    return Scheduler(SchedulerConfig(**kw), CacheConfig(block_size, num_blocks), make_block_hasher(algo, block_size))


def _req(rid: str, arrival: float, n: int, out: int = 1, base: int = 0, **kw) -> TraceRequest:
    return TraceRequest(rid, arrival, np.arange(base, base + n, dtype=np.int64), out, **kw)


def _replay(reqs, sched=None, step=0.01, **kw):
    return Replay(sched or _sched(), SimulatedExecutor(FixedLatency(step)), reqs, integrity_check=True, **kw).run()


# -- timing semantics ------------------------------------------------------------------------


def test_visible_at_first_step_starting_at_or_after_arrival():
    # engine idle until 1.0; steps then start at 1.0, 1.1, 1.2, ... (fixed 0.1 s)
    reqs = [_req("a", 1.0, 40, out=5), _req("b", 1.2, 40, out=1, base=1000), _req("c", 1.25, 40, out=1, base=2000)]
    res = _replay(reqs, step=0.1)
    r = res.requests.set_index("request_id")
    assert r.loc["a", "first_scheduled"] == pytest.approx(1.0)
    assert r.loc["b", "first_scheduled"] == pytest.approx(1.2)  # a step starts exactly at its arrival
    assert r.loc["c", "first_scheduled"] == pytest.approx(1.3)  # next step start after 1.25
    assert r.loc["a", "first_token"] == pytest.approx(1.1)  # end of the prefill step
    assert r.loc["a", "finish"] == pytest.approx(1.5)  # 5 steps: prefill + 4 decodes
    assert r.loc["a", "ttft"] == pytest.approx(0.1)
    assert r.loc["a", "tpot"] == pytest.approx(0.1)
    assert r.loc["c", "ttft"] == pytest.approx(0.15)


def test_idle_engine_starts_at_next_arrival():
    reqs = [_req("a", 0.0, 20), _req("b", 5.0, 20, base=100)]
    res = _replay(reqs, step=0.5)
    r = res.requests.set_index("request_id")
    assert r.loc["a", "finish"] == pytest.approx(0.5)
    assert r.loc["b", "first_scheduled"] == pytest.approx(5.0)
    assert list(res.steps["start"]) == pytest.approx([0.0, 5.0])
    assert res.summary["sim_time_s"] == pytest.approx(5.5)


def test_hit_tokens_and_readmission_recorded():
    # 4-block pool (3 usable): the second request waits for the first, then hits its prompt.
    sched = _sched(num_blocks=6, block_size=16, max_model_len=64, max_num_batched_tokens=64, max_num_seqs=4)
    reqs = [_req("a", 0.0, 33, out=2), _req("b", 0.0, 33, out=2)]
    res = _replay(reqs, sched)
    r = res.requests.set_index("request_id")
    assert r.loc["a", "hit_tokens"] == 0
    assert r.loc["b", "hit_tokens"] == 32
    assert res.summary["prefix_cache"]["hits"] == res.prefix_cache.hits


def test_request_that_never_fits_the_pool_stops_a_strict_run():
    sched = _sched(num_blocks=3, block_size=16, max_model_len=4096)
    with pytest.raises(ReplayError, match=r"request big: never_fits_pool: 100 KV slots .* 7 blocks of 16, the pool"):
        _replay([_req("big", 0.0, 100)], sched, reject_invalid=False)


def test_prompt_longer_than_max_model_len_stops_a_strict_run():
    with pytest.raises(ReplayError, match="request long: prompt_too_long: prompt of 5000 tokens, max_model_len 4096"):
        _replay([_req("long", 0.0, 5000)], _sched(max_model_len=4096), reject_invalid=False)


def test_unsorted_arrivals_rejected():
    with pytest.raises(ReplayError, match="before the previous"):
        _replay([_req("a", 1.0, 20), _req("b", 0.5, 20, base=50)])


# -- fast-forward equivalence ----------------------------------------------------------------


class _Linear(LatencyModel):
    name = "linear"

    def step_time(self, s: StepShape) -> float:
        return 0.004 + 2e-5 * s.num_new_tokens + 3e-8 * s.context_tokens + 1e-10 * s.attention_pairs


def _workload(seed: int, n: int, rate: float, with_outputs: bool = False) -> list[TraceRequest]:
    rng = np.random.default_rng(seed)
    prefixes = [rng.integers(0, 100_000, size=int(rng.integers(50, 1500))) for _ in range(4)]
    t, out = 0.0, []
    for i in range(n):
        t += float(rng.exponential(1 / rate))
        prefix = prefixes[int(rng.integers(0, 4))]  # drawn before the suffix (the workload's draw order)
        tokens = np.concatenate([prefix, rng.integers(0, 100_000, int(rng.integers(5, 200)))])
        n_out = int(rng.integers(1, 150))
        out_ids = rng.integers(0, 100_000, n_out) if with_outputs else None
        salt = "t1" if (with_outputs and i % 3 == 0) else None
        out.append(TraceRequest(f"r{i}", t, tokens, n_out, output_token_ids=out_ids, salt=salt, priority=i % 3))
    return out


CASES = [
    dict(num_blocks=300, max_num_batched_tokens=512, max_num_seqs=32),  # preemption-heavy
    dict(num_blocks=3000, max_num_batched_tokens=512, max_num_seqs=8),  # seq-limited
    dict(num_blocks=250, max_num_batched_tokens=2048, max_num_seqs=64, watermark=0.05),  # blocked heads
    dict(num_blocks=800, max_num_batched_tokens=256, max_num_seqs=16, policy="priority"),
    dict(num_blocks=1200, max_num_batched_tokens=4096, max_num_seqs=16, enable_chunked_prefill=False),
    dict(num_blocks=600, max_num_batched_tokens=1024, max_num_seqs=32, long_prefill_token_threshold=128),
    dict(num_blocks=260, max_num_batched_tokens=300, max_num_seqs=24),  # long chunked prefills, blocked heads
    dict(num_blocks=2000, max_num_batched_tokens=160, max_num_seqs=64, long_prefill_token_threshold=64),
]


@pytest.mark.parametrize("case", range(len(CASES)))
@pytest.mark.parametrize("with_outputs", [False, True])
def test_fast_forward_identical_to_plain_replay(case: int, with_outputs: bool):
    kw = dict(CASES[case])
    reqs = _workload(case, 150, rate=40.0, with_outputs=with_outputs)
    runs = []
    for ff in (False, True):
        sched = _sched(**{**kw, "max_model_len": 4096}, algo="fast")
        replay = Replay(sched, SimulatedExecutor(_Linear()), reqs, fast_forward=ff, integrity_check=True,
                        record_events=True)
        runs.append((replay.run(), sched))
    (plain, s_plain), (fast, s_fast) = runs
    pd.testing.assert_frame_equal(plain.requests, fast.requests)
    pd.testing.assert_frame_equal(plain.steps, fast.steps)
    assert plain.prefix_cache == fast.prefix_cache
    assert [(s, repr(e)) for s, e in plain.events] == [(s, repr(e)) for s, e in fast.events]
    assert s_plain.kv_cache_manager.block_pool.free_block_ids() == s_fast.kv_cache_manager.block_pool.free_block_ids()
    assert plain.summary == fast.summary
    assert plain.requests["first_token"].notna().all() and plain.requests["finish"].notna().all()


def test_fast_forward_actually_skips_work():
    """The windows must cover most decode steps when nothing else happens (else the test above is vacuous)."""
    reqs = [_req(f"r{i}", 0.0, 64, out=400, base=1000 * i) for i in range(8)]
    replay = Replay(_sched(), SimulatedExecutor(FixedLatency(0.01)), reqs, fast_forward=True)
    res = replay.run()
    assert len(res.steps) == 400
    assert replay.num_plain_steps < 10 and replay.num_window_steps == 400 - replay.num_plain_steps


def test_full_budget_chunks_are_fast_forwarded_while_requests_wait():
    """A prefill whose chunks take the whole token budget runs steps with no lookup (schedule()'s
    waiting loop needs budget left), so they form a window even while an admissible request
    waits; the window ends before the step that leaves budget, and equals the plain loop."""
    reqs = [_req("long", 0.0, 2000, out=60, base=0), _req("short", 0.0, 40, out=60, base=50_000),
            *(_req(f"w{i}", 0.001 * i, 100, out=30, base=100_000 + 1000 * i) for i in range(6))]
    runs = []
    for ff in (False, True):
        replay = Replay(_sched(max_num_batched_tokens=128, max_num_seqs=4), SimulatedExecutor(_Linear()), reqs,
                        fast_forward=ff, integrity_check=True, record_events=True)
        runs.append((replay.run(), replay.num_plain_steps))
    (plain, n_plain), (fast, n_fast) = runs
    pd.testing.assert_frame_equal(plain.requests, fast.requests)
    pd.testing.assert_frame_equal(plain.steps, fast.steps)
    assert [(s, repr(e)) for s, e in plain.events] == [(s, repr(e)) for s, e in fast.events]
    # "long" runs 15 chunks of 127 tokens beside the decoding "short" while w0..w5 wait; played
    # step by step those would be 14 more plain steps (22 when only refused heads made windows)
    full = plain.steps[(plain.steps["scheduled_tokens"] == 128) & (plain.steps["waiting"] > 0)]
    assert len(full) >= 14
    assert n_plain == 106 and n_fast <= 10


# -- asynchronous scheduling -----------------------------------------------------------------


def _async_sched(num_blocks: int = 1000, **kw) -> Scheduler:
    kw.setdefault("max_model_len", 4096)
    return Scheduler(SchedulerConfig(async_scheduling=True, **kw), CacheConfig(16, num_blocks),
                     make_block_hasher("sha256", 16))


def test_async_same_step_sharing_and_output_block_caching():
    # two identical prompts in one step: hits 0 and 48, as in sync mode (blocks cached at schedule time)
    res = _replay([_req("a", 0.0, 64, out=3), _req("b", 0.0, 64, out=3)], _async_sched())
    assert list(res.requests["hit_tokens"]) == [0, 48]
    # a follow-up containing the prompt and all 13 outputs hits 32: output blocks are cached one
    # step later in async mode but end up the same (P + N - 1 = 32 tokens of KV)
    first = _req("p", 0.0, 20, out=13)
    out_ids = [int(t) for t in np.arange(50_000, 50_013)]
    first.output_token_ids = np.array(out_ids, dtype=np.int64)
    follow = TraceRequest("f", 5.0, np.concatenate([np.arange(0, 20), out_ids, np.arange(900, 910)]), 1)
    res = _replay([first, follow], _async_sched())
    assert res.requests.set_index("request_id").loc["f", "hit_tokens"] == 32


def test_async_without_prefix_caching_caches_nothing():
    # vLLM's KVCacheManager.cache_blocks returns at once when caching is off: the async
    # scheduler's deferred caching of generated blocks must not hash a single block either
    sched = Scheduler(SchedulerConfig(async_scheduling=True, max_model_len=4096),
                      CacheConfig(16, 1000, enable_prefix_caching=False), make_block_hasher("sha256", 16))
    res = Replay(sched, SimulatedExecutor(FixedLatency(0.01)), _workload(2, 40, rate=20.0),
                 integrity_check=True).run()
    assert (res.steps["cached_blocks"] == 0).all()
    assert sched.kv_cache_manager.block_pool.num_cached_blocks == 0


def test_async_timing_and_integrity():
    reqs = _workload(3, 120, rate=60.0)
    res = Replay(_async_sched(num_blocks=300, max_num_batched_tokens=512, max_num_seqs=32),
                 SimulatedExecutor(FixedLatency(0.01)), reqs, integrity_check=True).run()
    r = res.requests
    assert r["finish"].notna().all() and r["first_token"].notna().all()
    assert (r["output_tokens"] == [t.output_tokens for t in reqs]).all()
    assert res.summary["num_preemptions"] > 0  # the small pool exercises preemption while steps are in flight
    single = _replay([_req("x", 0.0, 40, out=4)], _async_sched(), step=0.1).requests.iloc[0]
    assert single["ttft"] == pytest.approx(0.1) and single["finish"] == pytest.approx(0.4)


def test_numpy_scalars_in_a_trace_request_replay_as_python_ints():
    """A generator may hand numpy scalars (np.int64 output_tokens / priority, np.bool_
    prompt_logprobs): the replay takes them as the ints and bools they stand for (the compiled
    Request takes only those); a float output count is refused, naming the request and field."""
    reqs = [_req("a", 0.0, 40, out=5, base=0), _req("b", 0.01, 40, out=3, base=0, priority=1, prompt_logprobs=True)]
    as_numpy = [_req("a", 0.0, 40, out=np.int64(5), base=0),
                _req("b", 0.01, 40, out=np.int64(3), base=0, priority=np.int64(1), prompt_logprobs=np.bool_(True))]
    pd.testing.assert_frame_equal(_replay(reqs).requests, _replay(as_numpy).requests)
    with pytest.raises(ReplayError, match="request a: field 'output_tokens': expected an int, got 5.0"):
        _replay([_req("a", 0.0, 40, out=5.0)])

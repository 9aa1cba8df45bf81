"""Property tests of the miss attribution on random workloads (shared prefixes, salts, LoRAs,
prompt_logprobs, trace-given answers, chunked prefill, tiny and unbounded pools), with the
integrity check on: the causes add up on every request, both levels agree, an unbounded pool
evicts nothing, a workload without extra keys has no isolation, and on an unbounded pool the
causes reconcile exactly with the infinite-cache bound of ``workloads.bounds`` (the identity of
``sim.replay.attribution``'s docstring)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sim.core.config import CacheConfig, SchedulerConfig
from sim.core.hashing import make_block_hasher
from sim.core.scheduler import Scheduler
from sim.replay.attribution_records import CAUSES, REQUEST_MISS_COLUMNS
from sim.replay.engine import Replay
from sim.timing.latency import FixedLatency
from sim.timing.simulated_executor import SimulatedExecutor
from workloads.bounds import HitBound
from workloads.trace_format import TraceRequest

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
MAX_MODEL_LEN = 256
UNBOUNDED = 4000


@dataclasses.dataclass
class Case:
    block_size: int
    num_blocks: int
    config: dict
    requests: list[TraceRequest]


@st.composite
def cases(draw, extra_keys: bool = True, unbounded: bool | None = None) -> Case:
    bs = draw(st.sampled_from([4, 8]))
    bases = [draw(st.lists(st.integers(0, 30), min_size=n, max_size=n))
             for n in draw(st.lists(st.sampled_from([bs, 2 * bs + 1, 4 * bs, 6 * bs + 3]), min_size=1, max_size=2))]
    n = draw(st.integers(2, 12))
    reqs, t = [], 0.0
    for i in range(n):
        base = bases[draw(st.integers(0, len(bases) - 1))]
        cut = draw(st.sampled_from([len(base), len(base) // 2, draw(st.integers(0, len(base)))]))
        slen = draw(st.sampled_from([0, 1, bs - 1, bs, 2 * bs + 3]))
        prompt = (base[:cut] + draw(st.lists(st.integers(0, 2), min_size=slen, max_size=slen))) or [7]
        out = draw(st.integers(1, 8))
        given_answer = draw(st.booleans())
        t += draw(st.sampled_from([0.0, 0.0, 0.005, 0.02, 0.2]))
        reqs.append(TraceRequest(
            f"r{i}", t, np.asarray(prompt, dtype=np.int64), out,
            output_token_ids=np.asarray(draw(st.lists(st.integers(0, 2), min_size=out, max_size=out)),
                                        dtype=np.int64) if given_answer else None,
            salt=draw(st.sampled_from([None, None, "x", "y"])) if extra_keys else None,
            lora=draw(st.sampled_from([None, None, None, "l"])) if extra_keys else None,
            prompt_logprobs=draw(st.integers(0, 9)) == 0,
        ))
    big = draw(st.booleans()) if unbounded is None else unbounded
    need = -(-(max(int(r.tokens.size) for r in reqs) + 8) // bs) + 1
    num_blocks = UNBOUNDED if big else draw(st.integers(need, need + 12))
    config = {
        "max_num_batched_tokens": draw(st.sampled_from([16, 64, 2048])),
        "max_num_seqs": draw(st.sampled_from([2, 16])),
        "long_prefill_token_threshold": draw(st.sampled_from([0, 0, bs, 3])),
        "async_scheduling": draw(st.booleans()),
    }
    return Case(bs, num_blocks, config, reqs)


def run(case: Case, level: str) -> tuple[pd.DataFrame, dict]:
    sched = Scheduler(SchedulerConfig(max_model_len=MAX_MODEL_LEN, **case.config),
                      CacheConfig(case.block_size, case.num_blocks), make_block_hasher("sha256", case.block_size))
    res = Replay(sched, SimulatedExecutor(FixedLatency(0.01)), case.requests, integrity_check=True,
                 attribution=level).run()
    return res.requests.set_index("request_id"), res.summary


@SETTINGS
@given(case=cases())
def test_causes_add_up_and_levels_agree(case):
    full, s_full = run(case, "full")  # integrity check on: the replay asserts every request adds up
    summ, s_summ = run(case, "summary")
    missed = full.prompt_tokens - full.hit_tokens
    top = [f"miss_{c}_tokens" for c in CAUSES]
    assert (full[top].sum(axis=1) == missed).all()
    pd.testing.assert_frame_equal(full[list(REQUEST_MISS_COLUMNS)], summ[list(REQUEST_MISS_COLUMNS)])
    assert s_full == s_summ
    off, s_off = run(case, "off")
    pd.testing.assert_frame_equal(full[off.columns], off)


@SETTINGS
@given(case=cases(unbounded=True))
def test_unbounded_pool_reconciles_with_the_infinite_cache_bound(case):
    r, _ = run(case, "summary")
    assert (r.miss_evicted_tokens == 0).all()
    exact = HitBound(case.block_size)
    shared = HitBound(case.block_size)
    for q in case.requests:  # arrival order = FCFS admission order
        bound = exact.add(q)
        shared_bound = shared.add(dataclasses.replace(q, salt=None, lora=None))
        row = r.loc[q.id]
        if q.prompt_logprobs:
            assert row.miss_skip_tokens == row.prompt_tokens
            continue
        reach = row.hit_tokens + row.miss_in_flight_tokens + row.miss_unreachable_tokens
        assert reach == bound, q.id
        assert reach + row.miss_isolation_tokens == shared_bound, q.id
        lookup_tokens = (row.prompt_tokens - 1) // case.block_size * case.block_size
        assert row.miss_cold_tokens == lookup_tokens - shared_bound, q.id


@SETTINGS
@given(case=cases(extra_keys=False))
def test_no_extra_keys_no_isolation(case):
    r, s = run(case, "summary")
    assert (r.miss_isolation_tokens == 0).all()
    assert s["miss_attribution"]["isolation"] == 0

"""Differential check of sim.core's grouped KV-cache coordinators against vLLM 0.25.1's own KVCacheManager
(not collected by pytest: it needs vLLM's Python sources and their import-time dependencies).

The same ``sim.core.scheduler.Scheduler`` drives, on identical random workloads, either our
``KVCacheManager`` (over ``CacheConfig.kv_groups``) or vLLM's ``KVCacheManager`` (through a thin
adapter that maps the request status enum); after every step it compares scheduled tokens,
admissions and hit tokens, new block ids, preemptions, finishes, the free-queue order,
``PrefixCacheStats``, every group's block ids and all KV events.

Usage: ``python tools/vllm_diff_kv_groups.py [trials]`` with ``VLLM_SRC`` = the unpacked 0.25.1
wheel (default /tmp/vllm/full) and ``VLLM_DEPS`` = a ``pip install --target`` folder with what its
imports need (default /tmp/vdeps: regex msgspec transformers aiohttp openai_harmony openai pybase64
cachetools cloudpickle uvloop py-cpuinfo prometheus_client llguidance xgrammar).
"""

from __future__ import annotations

import os
import random
import sys
from pathlib import Path
from typing import Any

_ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(_ROOT), str(_ROOT / "tests"), os.environ.get("VLLM_SRC", "/tmp/vllm/full")]
sys.path.insert(3, os.environ.get("VLLM_DEPS", "/tmp/vdeps"))

import torch  # noqa: E402
from conftest import make_request, toks  # noqa: E402
from vllm.v1.core.kv_cache_manager import KVCacheManager as VllmKVCacheManager  # noqa: E402
from vllm.v1.core.single_type_kv_cache_manager import register_all_kvcache_specs  # noqa: E402
from vllm.v1.kv_cache_interface import (  # noqa: E402
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    SlidingWindowSpec,
)
from vllm.v1.request import RequestStatus as VllmStatus  # noqa: E402

from sim.core.config import CacheConfig, SchedulerConfig  # noqa: E402
from sim.core.hashing import make_block_hasher  # noqa: E402
from sim.core.kv_cache_spec import KVGroupSpec, blocks_for_one_sequence, resolve_block_sizes  # noqa: E402
from sim.core.request import RequestStatus  # noqa: E402
from sim.core.scheduler import Scheduler  # noqa: E402

register_all_kvcache_specs(None)
_STATUS = {
    RequestStatus.WAITING: VllmStatus.WAITING,
    RequestStatus.RUNNING: VllmStatus.RUNNING,
    RequestStatus.PREEMPTED: VllmStatus.PREEMPTED,
}
_EVENT_FIELDS = (
    "block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "lora_name", "extra_keys",
    "group_idx", "kv_cache_spec_kind", "kv_cache_spec_sliding_window", "medium",
)


class _VllmRequestView:
    """Our Request as vLLM's manager reads it (status mapped; no LoRA, MM or prompt embeds)."""

    def __init__(self, r: Any) -> None:
        self.r = r

    def __getattr__(self, k: str) -> Any:
        if k == "status":
            return _STATUS.get(self.r.status, VllmStatus.FINISHED_LENGTH_CAPPED)
        if k in ("lora_request", "prompt_embeds"):
            return None
        if k == "mm_features":
            return []
        return getattr(self.r, k)


class _PoolView:
    def __init__(self, pool: Any) -> None:
        self.pool = pool

    def free_block_ids(self) -> list[int]:
        return [b.block_id for b in self.pool.free_block_queue.get_all_free_blocks()]


class VllmAdapter:
    """vLLM's KVCacheManager behind the interface sim.core.scheduler.Scheduler uses."""

    def __init__(self, groups, num_blocks, max_model_len, max_num_batched_tokens, use_eagle, caching):
        specs = []
        for i, g in enumerate(groups):
            kw = dict(block_size=g.block_size, num_kv_heads=1, head_size=8, dtype=torch.float16)
            if g.kind == "full":
                spec = FullAttentionSpec(**kw)
            else:
                spec = SlidingWindowSpec(**kw, sliding_window=g.sliding_window)
            specs.append(KVCacheGroupSpec([f"layer{i}"], spec, is_eagle_group=g.is_eagle_group))
        sched_bs, hash_bs = resolve_block_sizes(groups, caching)
        self.m = VllmKVCacheManager(
            KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=specs),
            max_model_len,
            scheduler_block_size=sched_bs,
            hash_block_size=hash_bs,
            max_num_batched_tokens=max_num_batched_tokens,
            enable_caching=caching,
            use_eagle=use_eagle,
            log_stats=True,
            enable_kv_cache_events=True,
        )
        self.block_pool = _PoolView(self.m.block_pool)
        self.block_size = sched_bs

    def get_computed_blocks(self, r):
        return self.m.get_computed_blocks(_VllmRequestView(r))

    def allocate_slots(self, r, n, n_hit=0, hits=None, lookahead=0, full_sequence_must_fit=False,
                       has_scheduled_reqs=True):
        out = self.m.allocate_slots(_VllmRequestView(r), n, n_hit, hits, lookahead,
                                    full_sequence_must_fit=full_sequence_must_fit,
                                    has_scheduled_reqs=has_scheduled_reqs)
        return None if out is None else [b for g in out.blocks for b in g]

    def get_blocks(self, rid):
        return [b for g in self.m.get_blocks(rid).blocks for b in g]

    def get_block_ids_by_group(self, rid):
        blocks = self.m.get_blocks(rid).blocks
        return tuple([b.block_id for b in g] for g in blocks) if any(blocks) else ()

    def free(self, r):
        self.m.free(_VllmRequestView(r))

    def cache_blocks(self, r, n):
        self.m.cache_blocks(_VllmRequestView(r), n)

    def make_prefix_cache_stats(self):
        return self.m.make_prefix_cache_stats()


def _event(e: Any) -> dict[str, Any]:
    d = {k: getattr(e, k, None) for k in _EVENT_FIELDS}
    d["type"] = type(e).__name__
    kind = d["kv_cache_spec_kind"]
    d["kv_cache_spec_kind"] = None if kind is None else str(getattr(kind, "value", kind))
    if d["token_ids"] is not None:
        d["token_ids"] = [int(t) for t in d["token_ids"]]
    return d


def run(groups, seed, extra_blocks, budget, threshold, policy, extra, vllm):
    rng = random.Random(seed)
    caching = extra.get("enable_prefix_caching", True)
    use_eagle = extra.get("use_eagle", False)
    sched_bs, hash_bs = resolve_block_sizes(groups, caching)
    mml = 256
    nb = blocks_for_one_sequence(groups, budget, mml) + 1 + extra_blocks
    s = Scheduler(
        SchedulerConfig(max_num_batched_tokens=budget, max_num_seqs=6, max_model_len=mml,
                        long_prefill_token_threshold=threshold, policy=policy),
        CacheConfig(sched_bs, nb, caching, use_eagle, kv_groups=tuple(groups)),
        make_block_hasher("fast", hash_bs, 0),
    )
    ours: list = []
    if vllm:
        s.kv_cache_manager = VllmAdapter(groups, nb, mml, budget, use_eagle, caching)  # type: ignore[assignment]
    else:
        s.kv_cache_manager.block_pool.event_sink = ours.append
    kvm = s.kv_cache_manager
    bases = [toks(200, 100_000 * k) for k in range(3)]
    arrivals: dict[int, list] = {}
    for i in range(16):
        p = rng.choice(bases)[: rng.randrange(8, 200)] + toks(rng.randrange(0, 24), 1_000_000 + 1000 * i)
        r = make_request(s, f"r{i}", p, max_tokens=rng.randrange(1, 40), uid=i + 1, priority=rng.randrange(3))
        arrivals.setdefault(rng.randrange(0, 12), []).append(r)
    log = []
    for k in range(2000):
        for r in arrivals.get(k, ()):
            s.add_request(r)
        out = s.schedule()
        sampled = {
            x.request.request_id: [x.request.planned_output_token(len(x.request.output_token_ids))]
            for x in out.scheduled if x.samples
        }
        blocks = {x.request.request_id: tuple(kvm.get_block_ids_by_group(x.request.request_id)) for x in out.scheduled}
        finished = s.update_from_output(out, sampled)
        st = s.make_stats()
        events = kvm.m.take_events() if vllm else list(ours)
        ours.clear()
        log.append((
            k,
            [(x.request.request_id, x.num_new_tokens, x.admitted, x.hit_tokens, x.new_block_ids)
             for x in out.scheduled],
            [r.request_id for r in out.preempted],
            [r.request_id for r in finished],
            kvm.block_pool.free_block_ids(),
            (st.requests, st.queries, st.hits, st.preempted_requests, st.preempted_queries, st.preempted_hits),
            blocks,
            [_event(e) for e in events],
        ))
        if k >= 12 and not s.has_unfinished_requests():
            break
    return log


def _g(kind: str, bs: int, w: int | None = None, eagle: bool = False) -> KVGroupSpec:
    return KVGroupSpec(kind, bs, w, eagle)  # type: ignore[arg-type]


CONFIGS = [
    ([_g("sliding_window", 16, 32)], {}),
    ([_g("full", 16), _g("sliding_window", 16, 32)], {}),
    ([_g("full", 32), _g("sliding_window", 16, 16)], {}),
    ([_g("full", 32), _g("sliding_window", 16, 48), _g("sliding_window", 16, 48)], {"use_eagle": True}),
    ([_g("sliding_window", 16, 20), _g("full", 16), _g("sliding_window", 32, 64)], {}),
    ([_g("full", 16), _g("sliding_window", 16, 32, True)], {}),
    ([_g("full", 64), _g("sliding_window", 16, 32)], {"use_eagle": True}),
    ([_g("full", 32), _g("sliding_window", 16, 32), _g("sliding_window", 16, 32)], {"enable_prefix_caching": False}),
    ([_g("sliding_window", 16, 24), _g("sliding_window", 32, 100)], {"use_eagle": True}),
    ([_g("sliding_window", 16, 40)], {"use_eagle": True}),
    ([_g("full", 16), _g("sliding_window", 48, 100)], {}),
]


def main(trials: int) -> int:
    bad = total_hits = total_preempted = 0
    for t in range(trials):
        rng = random.Random(t)
        groups, extra = CONFIGS[t % len(CONFIGS)]
        args = (groups, t, rng.randrange(0, 30), rng.choice([48, 96, 256]), rng.choice([0, 40]),
                rng.choice(["fcfs", "priority"]), extra)
        a, b = run(*args, vllm=False), run(*args, vllm=True)
        total_hits += sum(x[3] for step in a for x in step[1])
        total_preempted += sum(len(step[2]) for step in a)
        if a != b:
            bad += 1
            diff = next(((x, y) for x, y in zip(a, b) if x != y), None)
            print(f"MISMATCH config {t % len(CONFIGS)} trial {t}:", diff if diff else (len(a), len(b)))
    print(f"trials {trials} mismatches {bad} hit tokens {total_hits} preemptions {total_preempted}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]) if len(sys.argv) > 1 else 220))

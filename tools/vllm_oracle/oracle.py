#!/usr/bin/env python3
"""Differential-testing oracle: replay a tokenized request trace through
vLLM 0.25.1's own v1 Scheduler + KVCacheManager (CPU only, no model) and
report per-request prefix-cache hits.

This is DEV-ONLY tooling. It is our own harness code written against vLLM's
(semi-)public classes; no vLLM source is copied here and no vLLM file is
modified. Everything vLLM-specific is *observed* from the outside:

  * hit tokens at admission are read from the request object right after
    ``schedule()`` (``num_computed_tokens - num_scheduled_tokens`` for every
    request that entered ``scheduler.running`` during that step), and
    cross-checked against a thin wrapper around
    ``kv_cache_manager.get_computed_blocks`` that only records its return
    value;
  * prefix-cache statistics are the ``PrefixCacheStats`` objects that vLLM's
    own ``make_stats()`` attaches to the ``EngineCoreOutputs`` returned by
    ``update_from_output()``;
  * KV events (optional) are the events vLLM hands to its publisher, captured
    by wrapping ``kv_cache_manager.take_events``.

Replay semantics (see README.md for the full statement):
  fixed step time d; at each step time t, add every request with
  arrival <= t (trace order), call schedule(), build a stub
  ModelRunnerOutput that gives exactly one sampled token to each scheduled
  request whose prefill is complete after this step, call
  update_from_output(); t += d (t stays put after a step that scheduled
  nothing: no forward pass runs for it).  When the engine goes idle, the next step
  starts at max(t, next arrival).

Run with the venv made by setup.sh:
    venv/bin/python oracle.py TRACE.jsonl --out OUT.csv [--stats-out S.json]
    venv/bin/python oracle.py --batch JOBS.jsonl [--batch-report R.jsonl] --quiet
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:  # offload_stub.py sits next to this file
    sys.path.insert(0, HERE)
# Tiny llama-style config.json; only used so that ModelConfig can be built
# offline. No weights exist or are ever loaded.
TINY_MODEL_DIR = os.path.join(HERE, "tiny_model")

# Model shape used only to size the KV cache spec (page size); it has no
# influence on scheduling because num_gpu_blocks is given explicitly.
NUM_KV_HEADS = 8
HEAD_SIZE = 128
NUM_LAYERS = 2

# Float tolerance for "arrival <= t" comparisons (t is computed as
# base + n*d, never accumulated, so drift is tiny anyway).
TIME_EPS = 1e-9


# --------------------------------------------------------------------------
# Trace loading
# --------------------------------------------------------------------------
@dataclass
class TraceReq:
    idx: int  # 0-based line index in the trace file
    rid: str
    arrival: float
    tokens: list[int]
    output_tokens: int
    output_token_ids: list[int] | None
    salt: str | None
    lora: str | None
    priority: int
    prompt_logprobs: bool


def load_trace(path: str) -> list[TraceReq]:
    reqs: list[TraceReq] = []
    seen: set[str] = set()
    if path.endswith(".gz"):
        import gzip
        fh = gzip.open(path, "rt")
    else:
        fh = open(path)
    with fh as f:
        for lineno, line in enumerate(f):
            line = line.strip()
            if not line:
                continue
            d = json.loads(line)
            i = len(reqs)
            rid = str(d["id"])
            if rid in seen:
                raise ValueError(f"duplicate request id {rid!r}")
            seen.add(rid)
            toks = [int(x) for x in d["tokens"]]
            if not toks:
                raise ValueError(f"{rid}: empty prompt")
            n_out = int(d["output_tokens"])
            if n_out < 1:
                raise ValueError(f"{rid}: output_tokens must be >= 1 (vLLM "
                                 "rejects max_tokens < 1)")
            oti = d.get("output_token_ids")
            if oti is not None:
                oti = [int(x) for x in oti]
                if len(oti) < n_out:
                    raise ValueError(f"{rid}: output_token_ids shorter than "
                                     "output_tokens")
            reqs.append(TraceReq(
                idx=i, rid=rid, arrival=float(d["arrival"]), tokens=toks,
                output_tokens=n_out, output_token_ids=oti,
                salt=d.get("salt"), lora=d.get("lora"),
                priority=int(d.get("priority", 0) or 0),
                prompt_logprobs=bool(d.get("prompt_logprobs", False)),
            ))
    # Requests are processed sorted by arrival, stable w.r.t. file order.
    # (idx stays the file line index; it feeds the synthetic output ids.)
    reqs.sort(key=lambda r: r.arrival)
    return reqs


def output_token(tr: TraceReq, j: int) -> int:
    """Value of the j-th (0-based) sampled token of a request."""
    if tr.output_token_ids is not None:
        return tr.output_token_ids[j]
    return (1 << 62) | (tr.idx << 24) | j


# --------------------------------------------------------------------------
# vLLM construction
# --------------------------------------------------------------------------
def ensure_tiny_model(max_pos: int) -> None:
    """(Re)write the local HF config used to satisfy ModelConfig."""
    os.makedirs(TINY_MODEL_DIR, exist_ok=True)
    cfg = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": NUM_KV_HEADS * HEAD_SIZE,
        "intermediate_size": 2048,
        "num_attention_heads": NUM_KV_HEADS,
        "num_key_value_heads": NUM_KV_HEADS,
        "head_dim": HEAD_SIZE,
        "num_hidden_layers": NUM_LAYERS,
        "vocab_size": 32000,
        "max_position_embeddings": max(max_pos, 1 << 24),
        "rms_norm_eps": 1e-5,
        "torch_dtype": "float16",
        "bos_token_id": 1,
        "eos_token_id": 2,
    }
    p = os.path.join(TINY_MODEL_DIR, "config.json")
    new = json.dumps(cfg, indent=2, sort_keys=True)
    try:
        with open(p) as f:
            if f.read() == new:
                return
    except FileNotFoundError:
        pass
    with open(p, "w") as f:
        f.write(new)


@dataclass
class Engine:
    scheduler: Any
    vllm_config: Any
    block_hasher: Any
    lora_ids: dict[str, int] = field(default_factory=dict)
    lora_config_enabled: bool = False


def is_v033() -> bool:
    """True for vLLM 0.33.x (the 0.33 API and semantics); False for 0.25.1."""
    v = _vllm_version()
    return not v.startswith("0.25.")


def offload_enabled(args) -> bool:
    return bool(getattr(args, "cpu_chunks", None)) or \
        getattr(args, "kv_offloading_size", None) is not None


def _layer_names() -> list[str]:
    return [f"model.layers.{i}.self_attn.attn" for i in range(NUM_LAYERS)]


def _kv_cache_config_0251(args, spec):
    from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec, KVCacheTensor
    layer_names = _layer_names()
    return KVCacheConfig(
        num_blocks=args.num_gpu_blocks,
        kv_cache_tensors=[KVCacheTensor(size=spec.page_size_bytes *
                                        args.num_gpu_blocks, shared_by=[n])
                          for n in layer_names],
        kv_cache_groups=[KVCacheGroupSpec(layer_names=layer_names,
                                          kv_cache_spec=spec)],
    )


def _kv_cache_config_033(args, spec, vllm_config):
    """vLLM 0.33's own planner (v1/core/kv_cache_planning.py:get_kv_cache_config_from_groups)
    with exactly num_gpu_blocks blocks: one KVCacheTensor holding every layer, as EngineCore
    builds it. Its size // num_blocks is the worker_kv_bytes_per_block the offloading config
    reads (offloading/config.py:build_offloading_config)."""
    from vllm.v1.core.kv_cache_planning import get_kv_cache_config_from_groups
    from vllm.v1.kv_cache_interface import KVCacheGroupSpec
    cc = vllm_config.cache_config
    if cc.kv_cache_layout is None:
        # resolved once by the engine core from the attention backend; the
        # OffloadingConnector requires LBHNC (get_required_kvcache_layout). For one group of
        # equal layers every layout gives the same bytes per block.
        cc.kv_cache_layout = "LBHNC"
    groups = [KVCacheGroupSpec(layer_names=_layer_names(), kv_cache_spec=spec)]
    bytes_per_block = NUM_LAYERS * spec.page_size_bytes
    kvc = get_kv_cache_config_from_groups(vllm_config, groups,
                                          bytes_per_block * args.num_gpu_blocks)
    assert kvc.num_blocks == args.num_gpu_blocks, (kvc.num_blocks, args.num_gpu_blocks)
    assert kvc.kv_cache_tensors[0].size // kvc.num_blocks == bytes_per_block
    return kvc


def kv_bytes_per_block(block_size: int) -> int:
    """KV bytes of one GPU block over all layers of the tiny model (one worker): what vLLM 0.33
    calls worker_kv_bytes_per_block = 2 (K,V) * block_size * heads * head_size * 2 B * layers."""
    return 2 * block_size * NUM_KV_HEADS * HEAD_SIZE * 2 * NUM_LAYERS


def cpu_bytes_for_chunks(num_chunks: int, block_size: int, blocks_per_chunk: int) -> int:
    """A cpu_bytes_to_use that makes CPUOffloadingSpec (v1/kv_offload/cpu/spec.py) size the tier
    to exactly num_chunks: num_chunks = cpu_bytes // round_up(kv_bytes_per_chunk, 4096)."""
    per_chunk = kv_bytes_per_block(block_size) * blocks_per_chunk
    aligned = -(-per_chunk // 4096) * 4096
    return num_chunks * aligned


def build_engine(args, max_model_len: int) -> Engine:
    # Make NONE_HASH (the parent hash of the first block) reproducible.
    # vLLM reads PYTHONHASHSEED inside init_none_hash(); setting it here only
    # affects that call, not Python's own str hashing of this process.
    # (0.33 derives it from a fixed default for sha256 when PYTHONHASHSEED is unset,
    # kv_cache_utils.py:resolve_none_hash_seed; with it set, both versions use it.)
    os.environ["PYTHONHASHSEED"] = str(args.hash_seed)
    v033 = is_v033()

    import torch
    from vllm.config import CacheConfig, DeviceConfig, KVEventsConfig, ModelConfig, SchedulerConfig, VllmConfig
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash, resolve_kv_cache_block_sizes
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import FullAttentionSpec
    from vllm.v1.structured_output import StructuredOutputManager

    if offload_enabled(args) and not v033:
        raise SystemExit("CPU offloading flags need the vLLM 0.33.0 venv (venv033)")

    ensure_tiny_model(max_model_len)
    model_config = ModelConfig(
        model=TINY_MODEL_DIR,
        skip_tokenizer_init=True,
        max_model_len=max_model_len,
        dtype="float16",
    )
    scheduler_config = SchedulerConfig(
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_num_seqs=args.max_num_seqs,
        max_model_len=max_model_len,
        is_encoder_decoder=False,
        enable_chunked_prefill=not args.no_chunked_prefill,
        long_prefill_token_threshold=args.long_prefill_token_threshold,
        policy=args.policy,
        watermark=args.watermark,
        async_scheduling=bool(args.async_sched),
        # scheduler_reserve_full_isl: left at its default (True in 0.25.1 and 0.33.0).
    )
    cache_kwargs: dict[str, Any] = dict(
        block_size=args.block_size,
        enable_prefix_caching=True,
        prefix_caching_hash_algo=args.hash_algo,
    )
    spec = FullAttentionSpec(block_size=args.block_size,
                             num_kv_heads=NUM_KV_HEADS, head_size=HEAD_SIZE,
                             dtype=torch.float16)
    kwargs: dict[str, Any] = dict(
        model_config=model_config,
        scheduler_config=scheduler_config,
        # Explicit device: there is no GPU and no vllm._C here; with "cpu"
        # the platform stays UnspecifiedPlatform, whose
        # check_and_update_config() does not touch our scheduler/cache
        # settings (the CpuPlatform one would force async_scheduling=False).
        device_config=DeviceConfig(device="cpu"),
    )
    if offload_enabled(args):
        from vllm.config import KVTransferConfig
        if args.cpu_chunks and args.kv_offloading_size is not None:
            raise SystemExit("give --cpu-chunks or --kv-offloading-size, not both")
        # a chunk size that is not a multiple of the block size: vLLM's own ValueError
        # (offloading/config.py:build_offloading_config) when the connector is built
        bs_chunk = args.offload_block_size or args.block_size
        extra: dict[str, Any] = {
            "eviction_policy": args.offload_policy,
            "offload_prompt_only": not args.offload_all_tokens,
            "store_threshold": args.store_threshold,
        }
        if args.offload_block_size:
            extra["block_size"] = args.offload_block_size
        if args.cpu_chunks:
            # What VllmConfig._post_init_kv_transfer_config (config/vllm.py) builds for
            # --kv-offloading-size with the native backend, with an exact byte budget.
            extra["cpu_bytes_to_use"] = cpu_bytes_for_chunks(
                args.cpu_chunks, args.block_size, max(1, bs_chunk // args.block_size))
            kwargs["kv_transfer_config"] = KVTransferConfig(
                kv_connector="OffloadingConnector", kv_role="kv_both",
                kv_connector_extra_config=extra)
        else:
            # vLLM's own path: CacheConfig.kv_offloading_size (GiB) -> OffloadingConnector,
            # kv_role kv_both, cpu_bytes_to_use = size * 2**30 (other extra keys kept)
            cache_kwargs["kv_offloading_size"] = args.kv_offloading_size
            kwargs["kv_transfer_config"] = KVTransferConfig(kv_connector_extra_config=extra)
    kwargs["cache_config"] = CacheConfig(**cache_kwargs)
    if args.events_out:
        # "null" publisher: vLLM builds the events but publishes nowhere;
        # we capture them from kv_cache_manager.take_events().
        kwargs["kv_events_config"] = KVEventsConfig(
            enable_kv_cache_events=True, publisher="null")
    # LoRA: we deliberately do NOT set a LoRAConfig. The scheduler only
    # consults lora_config for the max_loras admission limit; with
    # lora_config=None that limit does not exist ("not binding"), while the
    # LoRA name still enters the block hash via Request.lora_request.
    vllm_config = VllmConfig(**kwargs)

    # What EngineCore._initialize_kv_caches does after profiling:
    vllm_config.cache_config.num_gpu_blocks = args.num_gpu_blocks

    if v033:
        kv_cache_config = _kv_cache_config_033(args, spec, vllm_config)
    else:
        kv_cache_config = _kv_cache_config_0251(args, spec)
    sched_bs, hash_bs = resolve_kv_cache_block_sizes(kv_cache_config,
                                                     vllm_config)
    cls = AsyncScheduler if args.async_sched else Scheduler
    scheduler = cls(
        vllm_config=vllm_config,
        kv_cache_config=kv_cache_config,
        structured_output_manager=StructuredOutputManager(vllm_config),
        block_size=sched_bs,
        hash_block_size=hash_bs,
        include_finished_set=False,
        log_stats=True,
    )

    # Sanity: the knobs we asked for are what vLLM actually uses.
    sc = scheduler.scheduler_config
    assert scheduler.kv_cache_manager.block_pool.num_gpu_blocks == \
        args.num_gpu_blocks
    assert scheduler.kv_cache_manager.enable_caching
    assert sched_bs == hash_bs == args.block_size
    assert scheduler.max_num_scheduled_tokens == args.max_num_batched_tokens
    assert scheduler.max_num_running_reqs == args.max_num_seqs
    assert scheduler.max_model_len == max_model_len
    assert sc.enable_chunked_prefill == (not args.no_chunked_prefill)
    assert sc.long_prefill_token_threshold == args.long_prefill_token_threshold
    assert sc.policy == args.policy
    assert scheduler.kv_cache_manager.watermark_blocks == int(
        args.watermark * args.num_gpu_blocks)
    assert scheduler.num_lookahead_tokens == 0
    assert not scheduler.has_mamba_layers
    if offload_enabled(args):
        conn = scheduler.connector
        assert type(conn).__name__ == "OffloadingConnector", type(conn)
        mgr = conn.connector_scheduler.manager
        assert type(mgr).__name__ == "CPUOffloadingManager", type(mgr)
        assert conn.connector_scheduler.config.blocks_per_chunk == \
            (args.offload_block_size or args.block_size) // args.block_size
        if args.cpu_chunks:
            assert mgr._num_chunks == args.cpu_chunks, (mgr._num_chunks, args.cpu_chunks)
        # a kv_both connector is a consumer: with 2 batches in flight (async scheduling,
        # VllmConfig.max_concurrent_batches) vLLM defers block frees (Scheduler.__init__)
        assert scheduler.defer_block_free == bool(args.async_sched), \
            (scheduler.defer_block_free, vllm_config.max_concurrent_batches)
    else:
        assert scheduler.connector is None
    if v033:
        assert vllm_config.max_concurrent_batches == (2 if args.async_sched else 1)
        assert scheduler.num_hash_lookahead_tokens == 0

    hash_fn = get_hash_fn_by_name(vllm_config.cache_config
                                  .prefix_caching_hash_algo)
    init_none_hash(hash_fn)
    block_hasher = get_request_block_hasher(hash_bs, hash_fn)
    return Engine(scheduler=scheduler, vllm_config=vllm_config,
                  block_hasher=block_hasher)


def make_request(eng: Engine, tr: TraceReq):
    from vllm.lora.request import LoRARequest
    from vllm.sampling_params import SamplingParams
    from vllm.v1.request import Request

    sp = SamplingParams(
        max_tokens=tr.output_tokens,
        min_tokens=0,
        ignore_eos=True,
        prompt_logprobs=1 if tr.prompt_logprobs else None,
    )
    # SamplingParams.__post_init__ derives this from prompt_logprobs.
    assert sp.skip_reading_prefix_cache == tr.prompt_logprobs
    lora = None
    if tr.lora is not None:
        lid = eng.lora_ids.setdefault(tr.lora, len(eng.lora_ids) + 1)
        lora = LoRARequest(lora_name=tr.lora, lora_int_id=lid,
                           lora_path="/nonexistent")
    return Request(
        request_id=tr.rid,
        prompt_token_ids=list(tr.tokens),
        sampling_params=sp,
        pooling_params=None,
        arrival_time=tr.arrival,
        lora_request=lora,
        cache_salt=tr.salt,
        priority=tr.priority,
        block_hasher=eng.block_hasher,
    )


# --------------------------------------------------------------------------
# Per-request bookkeeping
# --------------------------------------------------------------------------
@dataclass
class ReqResult:
    rid: str
    num_prompt_tokens: int
    hit_tokens: int | None = None
    readmit_hits: list[int] = field(default_factory=list)
    first_scheduled_step: int | None = None
    first_token_step: int | None = None
    finish_step: int | None = None
    num_preemptions: int = 0
    tokens_emitted: int = 0  # stub sampler counter (j)
    # vLLM 0.33 only (0 / empty without a KV connector)
    external_hit_tokens: int | None = None
    readmit_external_hits: list[int] = field(default_factory=list)
    steps_waiting_for_kv: int = 0


STAT_FIELDS = ("requests", "queries", "hits", "preempted_requests",
               "preempted_queries", "preempted_hits")


def event_to_json(ev, step: int) -> dict:
    """Serialise a vLLM KVCacheEvent (msgspec struct) to plain JSON."""
    def conv(x):
        if isinstance(x, (bytes, bytearray)):
            return x.hex()
        if isinstance(x, (list, tuple)):
            return [conv(y) for y in x]
        return x
    d: dict[str, Any] = {"step": step, "type": type(ev).__name__}
    for name in getattr(ev, "__struct_fields__", ()):
        d[name] = conv(getattr(ev, name))
    return d


# --------------------------------------------------------------------------
# Replay
# --------------------------------------------------------------------------
def replay(args) -> tuple[list[ReqResult], dict]:
    from vllm.v1.outputs import ModelRunnerOutput

    trace = load_trace(args.trace)
    if not trace:
        raise SystemExit("empty trace")
    need_len = max(len(r.tokens) + r.output_tokens for r in trace)
    if args.max_model_len is not None:
        max_model_len = args.max_model_len
    elif args.no_chunked_prefill:
        # vLLM refuses max_num_batched_tokens < max_model_len without
        # chunked prefill, so use the tightest length that fits the trace.
        max_model_len = need_len
    else:
        max_model_len = max(131072, need_len)
    if need_len > max_model_len:
        raise SystemExit(f"max_model_len {max_model_len} < longest "
                         f"prompt+output {need_len}")
    if args.transfer_delay_steps < 1:
        raise SystemExit("--transfer-delay-steps must be >= 1 (a store of step s is submitted "
                         "by the worker at the start of step s+1)")

    t_build = time.time()
    eng = build_engine(args, max_model_len)
    sched = eng.scheduler
    kvm = sched.kv_cache_manager
    t_build = time.time() - t_build
    v033 = is_v033()
    conn = sched.connector  # vLLM 0.33 OffloadingConnector, or None

    # --- passive observers (wrap, record, return unchanged) -------------
    last_lookup: dict[str, int] = {}  # req_id -> hit tokens of last lookup
    orig_gcb = kvm.get_computed_blocks

    def get_computed_blocks_spy(request, *a, **kw):
        res = orig_gcb(request, *a, **kw)
        # 0.25.1: (blocks, n); 0.33: (blocks, n, shared_prefix_boundary)
        last_lookup[request.request_id] = res[1]
        return res
    kvm.get_computed_blocks = get_computed_blocks_spy

    observer = worker = None
    KVConnectorOutput = OffloadingWorkerMetadata = None
    if conn is not None:
        from offload_stub import OffloadObserver, StubWorker, fix_finished_order
        from vllm.distributed.kv_transfer.kv_connector.v1.offloading.common import OffloadingWorkerMetadata
        from vllm.v1.outputs import KVConnectorOutput
        observer = OffloadObserver(conn)
        worker = StubWorker(delay_steps=args.transfer_delay_steps)
        fix_finished_order(sched, args.finished_order)

    # 0.33: one record per admission (the waiting-loop allocation succeeded), at
    # KVCacheManager.record_prefix_cache_stats(request, local_hit) (v1/core/sched/scheduler.py,
    # schedule(), "Record at admission"); the connector's update_state_after_alloc of the same
    # admission came just before it and carries the external (CPU) tokens.
    step_admissions: list[tuple[str, int, int]] = []
    if v033:
        orig_rpcs = kvm.record_prefix_cache_stats

        def record_prefix_cache_stats_spy(request, num_hits):
            rid = request.request_id
            ext = observer.last_external.get(rid, 0) if observer is not None else 0
            assert last_lookup.get(rid) == num_hits, (rid, last_lookup.get(rid), num_hits)
            step_admissions.append((rid, num_hits, ext))
            return orig_rpcs(request, num_hits)
        kvm.record_prefix_cache_stats = record_prefix_cache_stats_spy

    events_f = open(args.events_out, "w") if args.events_out else None
    cur_step = [0]
    if events_f is not None:
        orig_take = kvm.take_events

        def take_events_spy():
            evs = orig_take()
            for ev in evs:
                events_f.write(json.dumps(event_to_json(ev, cur_step[0]))
                               + "\n")
            return evs
        kvm.take_events = take_events_spy
    steps_f = open(args.steps_out, "w") if getattr(args, "steps_out", None) else None

    results = {tr.rid: ReqResult(tr.rid, len(tr.tokens)) for tr in trace}
    by_id = {tr.rid: tr for tr in trace}
    req_objs: dict[str, Any] = {}
    totals = {k: 0 for k in STAT_FIELDS}
    conn_totals = {k: 0 for k in STAT_FIELDS}
    conn_hits_by_source: dict[str, int] = {}
    prompt_token_stats = None
    if v033:
        from vllm.v1.metrics.stats import PromptTokenStats
        prompt_token_stats = PromptTokenStats()
    waiting_for_kv: set[str] = set()

    d = args.step_time
    next_arrival = 0          # index into trace of the next request to add
    t_base = trace[0].arrival  # engine idle at start -> first step at arrival
    n_in_base = 0              # t = t_base + n_in_base * d
    step = 0
    batch = 0                  # schedule() calls so far (the worker's step index)
    num_finished = 0
    total_preemptions = 0
    max_running = 0
    t_loop = time.time()

    # Async scheduling: FIFO of in-flight scheduler outputs, mirroring
    # EngineCore.step_with_batch_queue with max_concurrent_batches == 2.
    inflight: deque = deque()
    # id(scheduler_output) -> {req_id: prefill complete after that schedule}
    complete_flags: dict[int, dict[str, bool]] = {}
    batch_of: dict[int, int] = {}  # id(scheduler_output) -> its batch index
    empty_streak = 0
    drain_steps = 0
    empty_steps = 0  # steps that scheduled nothing (free with --free-empty)
    # A single empty step is legitimate: when the running request that
    # needs a block preempts *itself* (priority policy: it is the worst
    # one; FCFS: it is the last one), vLLM breaks out of the running loop
    # and skips the waiting queue because a preemption happened, so that
    # step schedules nothing even though the next one will. Only a streak
    # of empty steps with no arrivals left is a deadlock.
    deadlock_after = 3

    def more_work() -> bool:
        if num_finished < len(trace):
            return True
        # with a connector the engine keeps stepping until its jobs have reported
        # (Scheduler.has_requests -> connector.has_pending_push_work)
        return conn is not None and (sched.has_requests() or bool(inflight))

    while more_work():
        t = t_base + n_in_base * d
        cur_step[0] = step
        # 1. admit arrivals (trace order)
        while (next_arrival < len(trace)
               and trace[next_arrival].arrival <= t + TIME_EPS):
            tr = trace[next_arrival]
            req = make_request(eng, tr)
            req_objs[tr.rid] = req
            sched.add_request(req)
            next_arrival += 1

        so = None
        to_process = None
        step_ev: dict[str, Any] | None = None
        if sched.has_requests():
            # 2. schedule
            running_before = {r.request_id for r in sched.running}
            if waiting_for_kv:
                for rid in list(waiting_for_kv):
                    r = sched.requests.get(rid)
                    if r is not None and r.status.name == "WAITING_FOR_REMOTE_KVS":
                        results[rid].steps_waiting_for_kv += 1
                    else:
                        waiting_for_kv.discard(rid)
            last_lookup.clear()
            step_admissions.clear()
            so = sched.schedule()
            batch_of[id(so)] = batch
            max_running = max(max_running, len(sched.running))
            # Remember which scheduled requests finish their prefill in this
            # step (they get a sampled token).
            complete_flags[id(so)] = {
                rid: not sched.requests[rid].is_prefill_chunk
                for rid in so.num_scheduled_tokens}
            if worker is not None:
                step_ev = worker.submit(batch, so.kv_connector_metadata)

            # 3a. (0.33) admissions recorded by the spy, in admission order
            admitted_now: dict[str, tuple[int, int]] = {}
            for rid, local, ext in step_admissions:
                res = results[rid]
                admitted_now[rid] = (local, ext)
                if res.hit_tokens is None:
                    assert req_objs[rid].num_preemptions == 0
                    res.hit_tokens = local
                    res.external_hit_tokens = ext
                else:
                    res.readmit_hits.append(local)
                    res.readmit_external_hits.append(ext)
                if ext > 0 and sched.requests[rid].status.name == "WAITING_FOR_REMOTE_KVS":
                    waiting_for_kv.add(rid)

            # 3b. who was admitted (waiting -> running) in this step?
            for r in sched.running:
                rid = r.request_id
                if rid in running_before:
                    continue
                hit = r.num_computed_tokens - so.num_scheduled_tokens[rid]
                res = results[rid]
                if v033:
                    if rid in admitted_now:
                        # admitted and run in the same step: no async load, so the computed
                        # tokens are the local hit (a sync load would add external ones)
                        local, ext = admitted_now[rid]
                        assert hit == local + ext, (rid, hit, local, ext)
                    # else: it ran after its async load (hit = local + external, or
                    # num_tokens - 1 after a full-prompt load)
                    if res.first_scheduled_step is None:
                        res.first_scheduled_step = step
                    continue
                # 0.25.1: cross-check with what get_computed_blocks returned (no KV
                # connector, so local hits are the only computed tokens).
                assert last_lookup.get(rid) == hit, (rid,
                                                     last_lookup.get(rid), hit)
                if res.hit_tokens is None:
                    assert r.num_preemptions == 0
                    res.hit_tokens = hit
                    res.first_scheduled_step = step
                else:
                    res.readmit_hits.append(hit)

            if args.async_sched:
                inflight.append(so)
                executed = so.total_num_scheduled_tokens > 0
                if len(inflight) < 2 and (executed or sched.has_requests()):
                    to_process = None   # do not block on the in-flight batch
                else:
                    to_process = inflight.popleft()
            else:
                to_process = so
            batch += 1
        elif inflight:
            # drain-only iteration (nothing left to schedule): still counted
            # as a step of duration d by this harness; see README
            to_process = inflight.popleft()
            drain_steps += 1

        # 4. stub model output -> update_from_output
        done_ev = None
        if to_process is not None:
            kvo = None
            if worker is not None:
                pb = batch_of[id(to_process)]
                kvo, done_jobs, recving = worker.report(pb, KVConnectorOutput,
                                                        OffloadingWorkerMetadata)
                done_ev = {"batch": pb, "completed": done_jobs, "finished_recving": recving}
            batch_of.pop(id(to_process), None)
            mro = stub_output(sched, to_process,
                              complete_flags.pop(id(to_process)), by_id,
                              results, ModelRunnerOutput, step, kvo)
            outs = sched.update_from_output(to_process, mro)
            # 5. collect outputs / stats
            for eco in outs.values():
                for o in eco.outputs:
                    if o.finish_reason is not None:
                        res = results[o.request_id]
                        assert res.finish_step is None
                        res.finish_step = step
                        num_finished += 1
                    if prompt_token_stats is not None and o.prefill_stats is not None:
                        prompt_token_stats.update_from_output(o.prefill_stats)
                st = eco.scheduler_stats
                if st is not None and st.prefix_cache_stats is not None:
                    for k in STAT_FIELDS:
                        totals[k] += getattr(st.prefix_cache_stats, k)
                cst = getattr(st, "connector_prefix_cache_stats", None) if st else None
                if cst is not None:
                    for k in STAT_FIELDS:
                        conn_totals[k] += getattr(cst, k)
                    for src, n in cst.hits_by_source.items():
                        key = getattr(src, "value", str(src))
                        conn_hits_by_source[key] = conn_hits_by_source.get(key, 0) + n

        if steps_f is not None and (so is not None or to_process is not None):
            rec: dict[str, Any] = {"step": step, "t": round(t, 9)}
            if so is not None:
                rec["batch"] = batch - 1
                rec["num_scheduled_tokens"] = so.total_num_scheduled_tokens
                rec["scheduled"] = dict(so.num_scheduled_tokens)
                rec["preempted"] = sorted(so.preempted_req_ids or ())
            if step_ev is not None:
                rec["load_jobs"] = [[j, so.kv_connector_metadata.load_jobs[j].req_id,
                                     observer.job_chunks(j)] for j in step_ev["loads"]]
                rec["store_jobs"] = [[j, so.kv_connector_metadata.store_jobs[j].req_id,
                                      observer.job_chunks(j)] for j in step_ev["stores"]]
                rec["jobs_to_flush"] = step_ev["flush"]
            if done_ev is not None:
                rec["processed_batch"] = done_ev["batch"]
                rec["completed_jobs"] = done_ev["completed"]
                rec["finished_recving"] = done_ev["finished_recving"]
            steps_f.write(json.dumps(rec, separators=(",", ":")) + "\n")

        # 6. deadlock detection
        if so is not None and so.total_num_scheduled_tokens == 0:
            empty_streak += 1
        else:
            empty_streak = 0
        if worker is not None and worker.pending():
            empty_streak = 0   # waiting for transfers is progress
        if (empty_streak >= deadlock_after and next_arrival >= len(trace)
                and sched.get_num_unfinished_requests() > 0):
            waiting = [r.request_id for r in sched.waiting]
            raise RuntimeError(
                f"deadlock at step {step} (t={t:.4f}): nothing scheduled, "
                f"{sched.get_num_unfinished_requests()} unfinished, no more "
                f"arrivals; waiting head={waiting[:3]} "
                f"free_blocks={kvm.block_pool.get_num_free_blocks()} "
                f"(pool too small for the head request?)")

        if not (args.free_drain and so is None):
            step += 1
            # the clock advances by d only if a forward pass ran: vLLM's model runner returns
            # EMPTY_MODEL_RUNNER_OUTPUT at once for a batch that schedules nothing
            # (GPUModelRunner.execute_model), so with --free-empty (default) such a step takes no
            # time; a drain-only iteration takes d only with --no-free-drain
            empty = so is not None and so.total_num_scheduled_tokens == 0
            if not (empty and args.free_empty):
                n_in_base += 1
            else:
                empty_steps += 1
        if args.max_steps and step >= args.max_steps:
            raise RuntimeError(f"--max-steps {args.max_steps} exceeded")
        # 7. engine idle -> next step starts at max(t, next arrival)
        if conn is not None:
            # with a connector the engine steps (free empty steps) until has_requests() is
            # false -- finished requests' last store pass, pending jobs -- before it idles
            idle = not sched.has_requests() and not inflight
        else:
            idle = sched.get_num_unfinished_requests() == 0 and not inflight
        # 8. stuck: `deadlock_after` steps in a row scheduled nothing, no batch with tokens is in
        # flight and no connector job is pending, so nothing can change until the next arrival;
        # empty steps being free, the clock would never reach it (an endless loop before).
        # A real engine spins empty steps while time passes: jump to the next arrival. (Never
        # taken by a run that finishes without it: the state repeats exactly.)
        stuck = (empty_streak >= deadlock_after
                 and all(b.total_num_scheduled_tokens == 0 for b in inflight)
                 and not (worker is not None and worker.pending()))
        if (idle or stuck) and next_arrival < len(trace):
            t_next = t_base + n_in_base * d
            nxt = trace[next_arrival].arrival
            if nxt > t_next:
                t_base, n_in_base = nxt, 0

    t_loop = time.time() - t_loop
    if events_f is not None:
        events_f.close()
    if steps_f is not None:
        steps_f.close()

    out: list[ReqResult] = []
    for tr in sorted(trace, key=lambda r: r.idx):
        res = results[tr.rid]
        res.num_preemptions = req_objs[tr.rid].num_preemptions
        total_preemptions += res.num_preemptions
        out.append(res)
    stats = dict(totals)
    stats.update(
        total_steps=step,
        drain_steps=drain_steps,
        empty_steps=empty_steps,
        total_preemptions=total_preemptions,
        num_requests=len(trace),
        max_running=max_running,
        sum_hit_tokens=sum(r.hit_tokens for r in out),
        sum_prompt_tokens=sum(r.num_prompt_tokens for r in out),
        build_seconds=round(t_build, 3),
        replay_seconds=round(t_loop, 3),
        config=dict(
            block_size=args.block_size,
            num_gpu_blocks=args.num_gpu_blocks,
            max_num_batched_tokens=args.max_num_batched_tokens,
            max_num_seqs=args.max_num_seqs,
            max_model_len=max_model_len,
            policy=args.policy,
            long_prefill_token_threshold=args.long_prefill_token_threshold,
            enable_chunked_prefill=not args.no_chunked_prefill,
            watermark=args.watermark,
            async_scheduling=bool(args.async_sched),
            free_drain=bool(args.free_drain),
            free_empty=bool(args.free_empty),
            hash_algo=args.hash_algo,
            step_time=args.step_time,
            scheduler_reserve_full_isl=bool(
                sched.scheduler_config.scheduler_reserve_full_isl),
            vllm_version=_vllm_version(),
        ),
    )
    if v033:
        stats["total_batches"] = batch
        stats["sum_external_hit_tokens"] = sum(r.external_hit_tokens or 0 for r in out)
        stats["prompt_tokens_by_source"] = {
            src: prompt_token_stats.get_by_source(src)
            for src in ("local_cache_hit", "external_kv_transfer", "local_compute")}
        stats["config"]["defer_block_free"] = bool(sched.defer_block_free)
    if conn is not None:
        stats["connector_prefix_cache"] = dict(conn_totals, hits_by_source=conn_hits_by_source)
        cfg = conn.connector_scheduler.config
        tier = observer.c.as_dict()
        tier.update(observer.final_state())
        tier["lookups_deferred_by_request"] = {
            k: v for k, v in sorted(observer.deferred.items())}
        stats["cpu_tier"] = tier
        stats["config"]["offload"] = dict(
            num_cpu_chunks=observer.manager._num_chunks,
            blocks_per_chunk=cfg.blocks_per_chunk,
            policy=args.offload_policy,
            offload_prompt_only=not args.offload_all_tokens,
            store_threshold=args.store_threshold,
            transfer_delay_steps=args.transfer_delay_steps,
            finished_order=args.finished_order,
            kv_bytes_per_block=kv_bytes_per_block(args.block_size),
            cpu_bytes_to_use=sched.vllm_config.kv_transfer_config.kv_connector_extra_config[
                "cpu_bytes_to_use"],
        )
    return out, stats


def stub_output(sched, so, complete, by_id, results, MRO, step, kv_connector_output=None):
    """Build the ModelRunnerOutput a real runner would return for `so`:
    one sampled token for each scheduled request whose prefill is complete
    after that schedule (`complete`, captured right after schedule()), and an
    empty list for partial prefill chunks. Requests already finished get an
    empty list too (vLLM skips them in update_from_output anyway). With a KV
    connector, `kv_connector_output` is the stub worker's report for this batch."""
    req_ids = list(so.num_scheduled_tokens.keys())
    sampled: list[list[int]] = []
    for rid in req_ids:
        r = sched.requests.get(rid)
        toks: list[int] = []
        if r is not None and not r.is_finished() and complete[rid]:
            res = results[rid]
            toks = [output_token(by_id[rid], res.tokens_emitted)]
            res.tokens_emitted += 1
            if res.first_token_step is None:
                res.first_token_step = step
        sampled.append(toks)
    kw = {}
    if kv_connector_output is not None:
        kw["kv_connector_output"] = kv_connector_output
    return MRO(req_ids=req_ids,
               req_id_to_index={rid: i for i, rid in enumerate(req_ids)},
               sampled_token_ids=sampled, **kw)


def _vllm_version() -> str:
    try:
        import importlib.metadata as md
        return md.version("vllm")
    except Exception:  # pragma: no cover
        return "?"


# --------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------
def parse_args(argv=None, *, batch_ok=True):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("trace", nargs="?", help="canonical JSONL trace")
    p.add_argument("--out", help="per-request CSV output (required unless "
                   "--batch)")
    p.add_argument("--stats-out", help="JSON file for accumulated stats")
    p.add_argument("--events-out", help="JSONL file for KV cache events")
    p.add_argument("--step-time", type=float, default=0.01)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--num-gpu-blocks", type=int,
                   help="total blocks in the pool, INCLUDING the null block "
                   "(required unless --batch)")
    p.add_argument("--max-num-batched-tokens", type=int, default=8192)
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--max-model-len", type=int, default=None)
    p.add_argument("--policy", choices=["fcfs", "priority"], default="fcfs")
    p.add_argument("--long-prefill-token-threshold", type=int, default=0)
    p.add_argument("--no-chunked-prefill", action="store_true")
    p.add_argument("--watermark", type=float, default=0.0)
    p.add_argument("--async", dest="async_sched", action="store_true",
                   help="use vLLM's AsyncScheduler (see README caveats)")
    p.add_argument("--free-drain", action=argparse.BooleanOptionalAction, default=True,
                   help="--async only: a drain-only iteration (nothing left to "
                   "schedule, only the last in-flight batch's output applied) "
                   "takes no time and is not counted as a step, as in apcsim "
                   "(default); --no-free-drain makes it a step of duration d")
    p.add_argument("--free-empty", action=argparse.BooleanOptionalAction, default=True,
                   help="a step whose schedule() scheduled no token takes no time (vLLM's "
                   "model runner runs no forward pass for it), as in apcsim (default); "
                   "--no-free-empty charges it d like any other step")
    p.add_argument("--hash-algo", default="sha256",
                   choices=["sha256", "sha256_cbor", "xxhash", "xxhash_cbor"])
    p.add_argument("--hash-seed", default="0",
                   help="PYTHONHASHSEED value vLLM uses for NONE_HASH")
    g = p.add_argument_group("vLLM 0.33.0 native CPU offloading (OffloadingConnector + "
                             "CPUOffloadingManager, stub worker)")
    g.add_argument("--cpu-chunks", type=int, default=0,
                   help="CPU tier of exactly N offload chunks (cpu_bytes_to_use = N * the "
                   "page-aligned KV bytes per chunk); 0 = no connector")
    g.add_argument("--kv-offloading-size", type=float, default=None,
                   help="vLLM's --kv-offloading-size in GiB (CacheConfig.kv_offloading_size) "
                   "instead of --cpu-chunks")
    g.add_argument("--offload-policy", choices=["lru", "arc"], default="lru",
                   help="kv_connector_extra_config eviction_policy")
    g.add_argument("--offload-block-size", type=int, default=0,
                   help="tokens per offload chunk (extra_config block_size, a multiple of "
                   "--block-size); 0 = one GPU block")
    g.add_argument("--store-threshold", type=int, default=0,
                   help="extra_config store_threshold (>=2: store a chunk only once offered "
                   "that many times)")
    g.add_argument("--offload-all-tokens", action="store_true",
                   help="extra_config offload_prompt_only=False (also store decode KV)")
    g.add_argument("--transfer-delay-steps", type=int, default=1,
                   help="stub worker: a load/store job of batch b reports complete in the "
                   "output of batch b+K (flushed jobs in b itself); see README")
    g.add_argument("--finished-order", choices=["finish", "sorted", "set"], default="finish",
                   help="order in which the connector sees the requests finished since the last "
                   "step (vLLM iterates a set of request-id strings: hash-seed dependent); "
                   "finish = the order they were freed (default), set = vLLM unchanged")
    p.add_argument("--steps-out", help="JSONL: one line per engine iteration (scheduled "
                   "tokens, preemptions; with a connector the load/store/flush jobs submitted "
                   "and the jobs reported complete)")
    p.add_argument("--max-steps", type=int, default=0,
                   help="safety cap on engine steps (0 = none)")
    p.add_argument("--quiet", action="store_true")
    if batch_ok:
        p.add_argument("--batch", metavar="JOBS.jsonl",
                       help="run many jobs in one process (vLLM is imported "
                       "once; a fresh Scheduler is built per job). Each line "
                       "is {\"argv\": [single-run CLI args...]} (optionally "
                       "with \"name\"); '-' reads jobs from stdin as they "
                       "come; see README")
        p.add_argument("--batch-report", metavar="R.jsonl",
                       help="with --batch: one JSON line per job (name, ok, "
                       "summary or error); default: stdout")
    args = p.parse_args(argv)
    if not getattr(args, "batch", None):
        missing = [n for n, v in (("trace", args.trace), ("--out", args.out),
                                  ("--num-gpu-blocks", args.num_gpu_blocks))
                   if v is None]
        if missing:
            p.error("the following arguments are required: "
                    + ", ".join(missing))
    return args


CSV_COLUMNS = ["id", "hit_tokens", "num_preemptions", "readmit_hit_tokens",
               "first_scheduled_step", "first_token_step", "finish_step", "num_prompt_tokens"]
# vLLM 0.33 adds (always, zeros without a connector):
CSV_COLUMNS_033 = ["external_hit_tokens", "readmit_external_hit_tokens", "steps_waiting_for_kv"]


def write_outputs(args, results, stats) -> dict:
    v033 = "prompt_tokens_by_source" in stats
    with open(args.out, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(CSV_COLUMNS + (CSV_COLUMNS_033 if v033 else []))
        for r in results:
            row = [r.rid, r.hit_tokens, r.num_preemptions,
                   ";".join(str(x) for x in r.readmit_hits),
                   r.first_scheduled_step, r.first_token_step,
                   r.finish_step, r.num_prompt_tokens]
            if v033:
                row += [r.external_hit_tokens or 0,
                        ";".join(str(x) for x in r.readmit_external_hits),
                        r.steps_waiting_for_kv]
            w.writerow(row)
    if args.stats_out:
        with open(args.stats_out, "w") as f:
            json.dump(stats, f, indent=2)
    summary = {k: stats[k] for k in (*STAT_FIELDS, "total_steps",
                                     "total_preemptions", "replay_seconds")}
    if "sum_external_hit_tokens" in stats:
        summary["sum_external_hit_tokens"] = stats["sum_external_hit_tokens"]
    return summary


def run_batch(args) -> int:
    """--batch: every line of the jobs file is one single-run invocation
    ({"argv": [...], "name": optional}). A job that fails (e.g. deadlock)
    is reported and the batch goes on. Exit status 0 iff every job ran."""
    import traceback
    rep = open(args.batch_report, "w") if args.batch_report else sys.stdout
    n_fail = 0
    if args.batch == "-":
        # streaming: one job per stdin line, one report line per job
        # (flushed), so a driver can keep a single warm process busy.
        lines = iter(sys.stdin.readline, "")
    else:
        with open(args.batch) as f:
            lines = f.readlines()
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        job = json.loads(line)
        name = job.get("name", str(i))
        t0 = time.time()
        try:
            jargs = parse_args([str(x) for x in job["argv"]], batch_ok=False)
            if jargs.quiet:
                os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
            results, stats = replay(jargs)
            rec = {"name": name, "ok": True,
                   "summary": write_outputs(jargs, results, stats)}
        except (Exception, SystemExit) as e:  # keep going
            n_fail += 1
            rec = {"name": name, "ok": False,
                   "error": f"{type(e).__name__}: {e}",
                   "traceback": traceback.format_exc()[-2000:]}
        rec["seconds"] = round(time.time() - t0, 3)
        rep.write(json.dumps(rec) + "\n")
        rep.flush()
    if rep is not sys.stdout:
        rep.close()
    return 1 if n_fail else 0


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.quiet:
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    if args.batch:
        return run_batch(args)
    results, stats = replay(args)
    summary = write_outputs(args, results, stats)
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())

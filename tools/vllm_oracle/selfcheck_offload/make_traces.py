#!/usr/bin/env python3
"""Writes the hand-made offload self-check traces (vLLM 0.33.0 OffloadingConnector, stub worker)
and what vLLM must report for them, checked by ../selfcheck_offload.sh.

Each case: <name>.jsonl (canonical trace) + an entry in expected.json:
  {name: {"args": [extra oracle args], "expect": {id: {csv column: value}},
          "stats": {dotted stats key: value}}}
The cases reproduce the [run] statements of the offload notes (../README.md, "Offload
self-checks"); bs 16, one GPU block per chunk unless the args say otherwise.
"""
import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))
cases: dict = {}


def P(n, base):
    return list(range(base, base + n))


def case(name, reqs, expect, args=(), stats=None):
    with open(os.path.join(HERE, name + ".jsonl"), "w") as f:
        for r in reqs:
            f.write(json.dumps(r) + "\n")
    cases[name] = {"args": [str(a) for a in args], "expect": expect, "stats": stats or {}}


# 1. a 32-token prompt repeated after its first run: the GPU hit is capped at num_tokens - 1
#    (16), the CPU lookup is not (OS._lookup_complete_chunks: min(num_tokens, keys * 16)), so
#    the last block is loaded from CPU although it is still in the GPU cache: GPU 16 + CPU 16.
#    The load is admitted at step 3 (b arrives at t=1 after the finished-request step 2):
#    sync K=1 -> reported in the output of step 4, runs at step 5 (s+2, 2 schedule() calls in
#    WAITING_FOR_REMOTE_KVS); async -> runs at s+3.
rep = [dict(id="a", arrival=0.0, tokens=P(32, 100), output_tokens=2),
       dict(id="b", arrival=1.0, tokens=P(32, 100), output_tokens=2)]
case("repeat32_sync", rep,
     {"a": {"hit_tokens": 0, "external_hit_tokens": 0},
      "b": {"hit_tokens": 16, "external_hit_tokens": 16, "steps_waiting_for_kv": 2,
            "first_scheduled_step": 5}},
     args=["--num-gpu-blocks", 16, "--cpu-chunks", 8],
     stats={"prompt_tokens_by_source.local_cache_hit": 16,
            "prompt_tokens_by_source.external_kv_transfer": 16,
            "prompt_tokens_by_source.local_compute": 32,
            "connector_prefix_cache.queries": 48, "connector_prefix_cache.hits": 16,
            "cpu_tier.stored_chunks": 2, "cpu_tier.loaded_chunks": 1})
case("repeat32_async", rep,
     {"a": {"hit_tokens": 0, "external_hit_tokens": 0},
      "b": {"hit_tokens": 16, "external_hit_tokens": 16, "steps_waiting_for_kv": 3,
            "first_scheduled_step": 7}},
     args=["--num-gpu-blocks", 16, "--cpu-chunks", 8, "--async"])

# 2. pending_defer: a's 4 prompt chunks are offered after its prefill step 0 and complete only
#    K=3 steps later; b (same prompt) arrives at step 1 with GPU hit 48 and its CPU run starting
#    at a chunk still being written (HIT_PENDING) -> get_num_new_matched_tokens returns None,
#    b is skipped (steps 1, 2, 3) and c, behind it in the queue, is admitted at step 1. At step 4
#    b gets GPU 48 + CPU 16.
A = P(64, 1000)
case("pending_defer",
     [dict(id="a", arrival=0.0, tokens=A, output_tokens=3),
      dict(id="b", arrival=0.005, tokens=A, output_tokens=2),
      dict(id="c", arrival=0.005, tokens=P(20, 5000), output_tokens=2)],
     {"a": {"hit_tokens": 0}, "b": {"hit_tokens": 48, "external_hit_tokens": 16,
                                     "first_scheduled_step": 8},
      "c": {"hit_tokens": 0, "first_scheduled_step": 1}},
     args=["--num-gpu-blocks", 32, "--cpu-chunks", 16, "--transfer-delay-steps", 3],
     stats={"cpu_tier.lookups_deferred_by_request.b": 3})

# 3. scan_reuse: hot prompt H (65 tokens = 4 chunks + 1) twice, then three one-off scans of the
#    same size through a 8-chunk CPU tier and a 7-usable-block GPU pool, then H again. h2 has
#    GPU 64 and no external hit, so its 4 chunks are offered again and count as reused (ARC:
#    T1 -> T2 at finish). The scans evict: LRU drops H's chunks, ARC (target_t1 = 0) evicts
#    scan chunks from T1 and keeps H in T2 -> h3 gets CPU 64 under ARC, 0 under LRU.
H = P(65, 1000)
scan = [dict(id="h1", arrival=0.0, tokens=H, output_tokens=1),
        dict(id="h2", arrival=1.0, tokens=H, output_tokens=1),
        dict(id="s1", arrival=2.0, tokens=P(65, 2000), output_tokens=1),
        dict(id="s2", arrival=3.0, tokens=P(65, 3000), output_tokens=1),
        dict(id="s3", arrival=4.0, tokens=P(65, 4000), output_tokens=1),
        dict(id="h3", arrival=5.0, tokens=H, output_tokens=1)]
case("scan_reuse_lru", scan, {"h2": {"hit_tokens": 64, "external_hit_tokens": 0},
                              "h3": {"hit_tokens": 0, "external_hit_tokens": 0}},
     args=["--num-gpu-blocks", 8, "--cpu-chunks", 8, "--offload-policy", "lru"])
case("scan_reuse_arc", scan, {"h2": {"hit_tokens": 64, "external_hit_tokens": 0},
                              "h3": {"hit_tokens": 0, "external_hit_tokens": 64}},
     args=["--num-gpu-blocks", 8, "--cpu-chunks", 8, "--offload-policy", "arc"])

# 4. preempt_resume: A (20 + 60 outputs) grows and preempts B (49-token prompt, its 3 prompt
#    chunks stored after its prefill) in a 6-usable-block pool; A's growth re-uses two of B's
#    freed blocks, so B resumes with GPU 16 + CPU 32.
case("preempt_resume",
     [dict(id="A", arrival=0.0, tokens=P(20, 1000), output_tokens=60),
      dict(id="B", arrival=0.005, tokens=P(49, 2000), output_tokens=30)],
     {"A": {"hit_tokens": 0, "num_preemptions": 0},
      "B": {"hit_tokens": 0, "num_preemptions": 1, "readmit_hit_tokens": "16",
            "readmit_external_hit_tokens": "32", "steps_waiting_for_kv": 2}},
     args=["--num-gpu-blocks", 7, "--cpu-chunks", 16])

with open(os.path.join(HERE, "expected.json"), "w") as f:
    json.dump(cases, f, indent=1)

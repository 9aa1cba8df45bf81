"""Runs with the vLLM 0.33.0 oracle venv (tools/vllm_oracle/venv033), not the test venv: replays
the sequential two-tier model's calls on vLLM's own ``CPUOffloadingManager`` (its LRU and ARC
policies) and prints the per-request CPU hits and the store counts, for tests/test_tier_bounds.py.

Usage: python tier_bounds_vllm_driver.py DIR (DIR holds cases.json and one CASE.npz per case: the
reference string, the GPU hits of workloads.tier_bounds, and the case's tier arguments). The glue
(lookup from the GPU boundary, loaded and offered ranges) repeats the connector's rules
(``OS:_lookup_complete_chunks``, ``update_state_after_alloc``, ``_build_store_jobs``); everything the
manager and policy decide is vLLM's."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
from vllm.v1.kv_offload.base import LookupResult, ReqContext, make_offload_key
from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager


def run_case(kw: dict, bs: int, d: dict) -> dict:
    ids, bpc = d["ids"].tolist(), kw["blocks_per_chunk"]
    mgr = CPUOffloadingManager(kw["cpu_chunks"], cache_policy=kw["policy"], store_threshold=kw["store_threshold"])
    cpu_hits: list[int] = []
    counts = [0, 0, 0, 0]  # stored, evicted, allocation failures, reused
    rows = zip(d["start"].tolist(), d["length"].tolist(), d["pb"].tolist(), d["reads"].tolist(), d["gpu"].tolist())
    for r, (s, ln, pb, reads, gpu) in enumerate(rows):
        n, n_store = pb // bpc, (pb if kw["prompt_only"] else ln) // bpc
        ctx = ReqContext(req_id=str(r))
        mgr.on_new_request(ctx)
        keys = []
        for j in range(max(n, n_store)):
            k = make_offload_key(ids[s + j * bpc + bpc - 1].to_bytes(16, "big"), 0)
            ctx.set_offload_key_position(k, (j + 1) * bpc * bs)
            keys.append(k)
        g, e = gpu // bs, 0
        if reads and n * bpc - g >= bpc:
            c = g // bpc
            while c < n and mgr.lookup(keys[c], ctx) is LookupResult.HIT:
                c += 1
            e = c * bpc - g if c * bpc - g >= bpc else 0
        cpu_hits.append(e * bs)
        start = (g + e) // bpc if e else 0
        if e:
            loaded = keys[g // bpc : start]
            mgr.prepare_load(loaded, ctx)
            mgr.complete_load(loaded, ctx)
            counts[3] += len(loaded)
        offer = keys[start:n_store]
        if offer:
            counts[3] += sum(1 for k in offer if mgr.lookup(k, ctx) is LookupResult.HIT)
            out = mgr.prepare_store(offer, ctx)
            if out is None:
                counts[2] += 1
            else:
                counts[0] += len(out.keys_to_store)
                counts[1] += len(out.evicted_keys)
                if out.keys_to_store:
                    mgr.complete_store(out.keys_to_store, ctx)
        mgr.on_request_finished(ctx)
    return {"cpu": cpu_hits, "counts": counts}


def main() -> None:
    folder = Path(sys.argv[1])
    cases = json.loads((folder / "cases.json").read_text())
    result = {name: run_case(c["kw"], c["bs"], dict(np.load(folder / f"{name}.npz"))) for name, c in cases.items()}
    print(json.dumps(result))


if __name__ == "__main__":
    main()

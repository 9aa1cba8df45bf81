"""The measuring stages of ``gpu_backend/device/device_run.sh``: correctness, long context, speed.

Mirrors nothing in vLLM. Each stage returns a JSON-able dict and logs its table lines:

* :func:`correctness` -- the reuse-equals-recompute suite (:mod:`gpu_backend.validation.cases`, every case
  with the block-table check after every step: the executor's tables must equal
  ``KVCacheManager.get_block_ids``, which catches a permutation of blocks inside the visible
  context that the logits alone could miss) with the tiny model in fp32 (``max |dlogit| <= 1e-5``)
  and bf16 (same top token where the dense margin exceeds 0.25, KL <= 1e-2), with ``reference`` and
  (CUDA) ``auto`` attention, both negative controls (which must fail); the CPU offload tier's cases
  (:mod:`gpu_backend.validation.cases_offload`: prefixes loaded back from the CPU store, on CUDA by the
  worker's own streams into pinned memory and back; a corrupted CPU chunk must fail); on CUDA (not
  ``quick``) also Llama-3-8B shapes in bf16 through the fast path;
* :func:`long_context` -- ``cases_long.case_long_context``: a 32k-token prompt in chunks and a request
  hitting its 2,048 blocks, fp32 tiny model (``quick``: 4k tokens), ``reference`` and (CUDA) ``auto``;
* :func:`bench` -- measured copy bandwidth and matmul rate, decode attention at batch 64 x 4k, whole
  steps; every figure as a share of the GPU's nominal peaks (``sim/timing/specs/gpus.yaml``) and
  of the ceilings measured here.

Invariants: a stage never raises for a failed check (it reports it: ``ok`` false); time budgets
are checked between parts. Imports torch.
"""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Callable
from importlib import metadata
from typing import Any

import torch

from gpu_backend.attention import select_attention
from gpu_backend.attention.flash import find_varlen_attn, varlen_takes_block_table
from gpu_backend.device import bench as bench_mod
from gpu_backend.executor.model import LlamaModel
from gpu_backend.layout.shapes import TINY, resolve_model_shape
from gpu_backend.validation import cases, cases_long, cases_offload

Log = Callable[[str], object]


def _version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def env_info(device: torch.device) -> dict[str, Any]:
    info: dict[str, Any] = {
        "python": platform.python_version(), "torch": torch.__version__, "numpy": _version("numpy"),
        "triton": _version("triton"), "device": str(device), "varlen_attn": find_varlen_attn() is not None,
        "varlen_attn_block_table": varlen_takes_block_table(), "cpu_threads": torch.get_num_threads(),
    }
    if device.type == "cuda":
        p = torch.cuda.get_device_properties(device)
        info.update(device_name=p.name, capability=f"{p.major}.{p.minor}", sms=p.multi_processor_count,
                    memory_gib=round(p.total_memory / 2**30, 1), cuda=torch.version.cuda)
    return info


def _suite(log: Log, model: LlamaModel, attention_req: str, label: str, fill: float, fns: dict[str, Any],
           negatives: dict[str, Any]) -> list[dict[str, Any]]:
    backend, rep = select_attention(attention_req, device=model.device, dtype=model.dtype, block_size=16,
                                    num_heads=model.num_heads, num_kv_heads=model.num_kv_heads,
                                    head_dim=model.head_dim)
    log(f"-- {label}: attention={rep['name']} probes={rep.get('probes', {})}")
    rows = []
    for name, fn, negative in [(n, f, False) for n, f in fns.items()] + [(n, f, True) for n, f in negatives.items()]:
        t0 = time.perf_counter()
        try:
            r = fn(model, backend, fill=fill)
        except Exception as exc:  # a crash is a failed verdict, reported
            rows.append({"suite": label, "case": name, "negative_control": negative, "verdict": False,
                         "error": f"{type(exc).__name__}: {str(exc)[:300]}"})
            log(f"  FAIL {name:24s} crashed: {rows[-1]['error']}")
            continue
        passed = r.passes(model.dtype)
        ok_scen = bool(r.facts.get("ok_scenario"))
        verdict = (not passed if negative else passed) and ok_scen
        rows.append({"suite": label, "case": r.name, "negative_control": negative, "attention": r.attention,
                     "dtype": str(model.dtype).replace("torch.", ""), "max_abs_logit_diff": r.max_abs_diff,
                     "max_kl": r.max_kl, "top1_mismatches": r.top1_mismatches, "compared": r.num_compared,
                     "comparison_passes": passed, "scenario_ok": ok_scen, "verdict": verdict,
                     "verify_block_tables": True, "seconds": round(time.perf_counter() - t0, 2),
                     "facts": {k: v for k, v in r.facts.items() if k != "hits"}})
        log(f"  {'OK  ' if verdict else 'FAIL'} {r.name:24s} {'(must fail)' if negative else '':11s} "
            f"n={r.num_compared:3d} max|dlogit|={r.max_abs_diff:.2e} maxKL={r.max_kl:.1e} "
            f"top1_mismatch={r.top1_mismatches} ({rows[-1]['seconds']} s)")
    return rows


def correctness(device: torch.device, *, quick: bool, log: Log) -> dict[str, Any]:
    nan = float("nan")
    suites = [("float32", "reference", nan), ("bfloat16", "reference", nan)]
    if device.type == "cuda":
        suites += [("float32", "auto", 1e4), ("bfloat16", "auto", 1e4)]  # fast paths: garbage in unwritten slots
    rows: list[dict[str, Any]] = []
    for dt, attn, fill in suites:
        model = LlamaModel(TINY, dtype=getattr(torch, dt), device=device, seed=0)
        rows += _suite(log, model, attn, f"tiny/{dt}/{attn}", fill, {**cases.CASES, **cases_offload.OFFLOAD_CASES},
                       {**cases.NEGATIVE_CASES, **cases_offload.OFFLOAD_NEGATIVE})
        del model
    if device.type == "cuda" and not quick:
        model = LlamaModel(resolve_model_shape("llama-3-8b"), dtype=torch.bfloat16, device=device, seed=0)
        pick = {k: cases.CASES[k] for k in ("prefix_hit", "chunked_prefill_decode")}
        rows += _suite(log, model, "auto", "llama-3-8b/bfloat16/auto", 1e4, pick,
                       {"corrupt_shared_block": cases.NEGATIVE_CASES["corrupt_shared_block"]})
        del model
        torch.cuda.empty_cache()
    ok = all(r["verdict"] for r in rows)
    log(f"== correctness {'PASSED' if ok else 'FAILED'} ({sum(r['verdict'] for r in rows)}/{len(rows)} verdicts)")
    return {"env": env_info(device), "cases": rows, "ok": ok}


def long_context(device: torch.device, *, quick: bool, log: Log) -> dict[str, Any]:
    ctx = 4096 if quick else 32768
    model = LlamaModel(TINY, dtype=torch.float32, device=device, seed=0)
    rows = []
    for attn in ("reference", "auto") if device.type == "cuda" else ("reference",):
        fill = float("nan") if attn == "reference" else 1e4

        def case(m: LlamaModel, b: Any, fill: float) -> cases.CaseResult:
            return cases_long.case_long_context(m, b, context=ctx, fill=fill)

        rows += _suite(log, model, attn, f"tiny/float32/{attn}/{ctx}", fill, {"long_context": case}, {})
    ok = all(r["verdict"] for r in rows)
    log(f"== long context ({ctx} tokens) {'PASSED' if ok else 'FAILED'}")
    return {"context_tokens": ctx, "cases": rows, "ok": ok}


def _nominal(device: torch.device) -> tuple[float, float, str]:
    """(HBM TB/s, bf16 TFLOP/s, spec name) of the GPU's datasheet entry, H200 by default."""
    from sim.timing.roofline import load_gpu_spec

    name = "H200"
    if device.type == "cuda":
        dev = torch.cuda.get_device_name(device)
        for cand in ("H100-SXM", "H200", "A100-80GB", "L40S"):
            if cand.split("-")[0] in dev:
                name = cand
    g = load_gpu_spec(name)
    return float(g.hbm_bandwidth_tbps), float(g.bf16_tflops), name


def bench(device: torch.device, *, quick: bool, log: Log, budget_s: float | None = None) -> dict[str, Any]:
    t0 = time.perf_counter()
    big = device.type == "cuda" and not quick
    hbm, tflops, spec_name = _nominal(device)
    ceil = bench_mod.measure_ceilings(device, quick=not big)
    log(f"== ceilings measured here: copy {ceil['copy_tbps']:.3g} TB/s, matmul {ceil['matmul_tflops']:.3g} TFLOP/s "
        f"{ceil['matmul_dtype']}; nominal {spec_name}: {hbm} TB/s, {tflops:g} bf16 TFLOP/s")
    spec = resolve_model_shape("llama-3-8b") if big else TINY
    dtype = torch.bfloat16 if big else torch.float32
    if big:
        dims: dict[str, Any] = dict(batch=64, context=4096, num_heads=spec.num_attention_heads,
                                    num_kv_heads=spec.num_kv_heads, head_dim=spec.head_dim, dtype=dtype, device=device)
        impls = ["reference", "flash_paged"] + (["triton"] if _version("triton") else [])
        tcfg = [dict(tile=64, num_warps=4, num_stages=2), dict(tile=128, num_warps=4, num_stages=2),
                dict(tile=64, num_warps=8, num_stages=3), dict(tile=128, num_warps=8, num_stages=2, num_splits=8)]
        dec = bench_mod.bench_decode_attention(impls, block_size=16, triton_configs=tcfg, peak_tbps=hbm, **dims)
        dec += bench_mod.bench_decode_attention(["flash_paged"], block_size=256, peak_tbps=hbm, **dims)
    else:
        dims = dict(batch=8, context=256, num_heads=spec.num_attention_heads, num_kv_heads=spec.num_kv_heads,
                    head_dim=spec.head_dim, dtype=dtype, device=device, warmup=1, iters=3)
        use_triton = _version("triton") and (device.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1")
        dec = bench_mod.bench_decode_attention(["reference"] + (["triton"] if use_triton else []), block_size=16,
                                               peak_tbps=hbm, **dims)
    for r in dec:
        if "tbps" in r:
            r["pct_of_measured_copy"] = 100 * r["tbps"] / ceil["copy_tbps"]
            log(f"   decode attention {r['impl']:44s} bs={r['block_size']:<4d} {r['time_ms']:8.3f} ms "
                f"{r['tbps']:7.3g} TB/s = {r['pct_of_peak']:5.1f} % of {hbm} TB/s nominal, "
                f"{r['pct_of_measured_copy']:5.1f} % of measured copy")
        else:
            log(f"   decode attention {r['impl']:44s} bs={r['block_size']:<4d} unavailable: {r.get('error')}")
    steps: list[dict[str, Any]] = []
    if budget_s is None or time.perf_counter() - t0 < budget_s:
        model = LlamaModel(spec, dtype=dtype, device=device, seed=0)
        attention, rep = select_attention("auto", device=device, dtype=dtype, block_size=16,
                                          num_heads=spec.num_attention_heads, num_kv_heads=spec.num_kv_heads,
                                          head_dim=spec.head_dim)
        if big:
            scen = {"prefill_cold_4x2048": [(0, 2048)] * 4, "prefill_hit3k_4x1024": [(3072, 1024)] * 4,
                    "decode_64x4k": [(4095, 1)] * 64, "mixed_2x512+62x4k": [(2048, 512)] * 2 + [(4095, 1)] * 62}
            steps = bench_mod.bench_model_steps(model, attention, scenarios=scen, peak_tbps=hbm, peak_tflops=tflops)
        else:
            scen = {"prefill_cold_2x128": [(0, 128)] * 2, "prefill_hit_2x32": [(96, 32)] * 2,
                    "decode_8x256": [(255, 1)] * 8, "mixed": [(64, 32)] + [(255, 1)] * 4}
            steps = bench_mod.bench_model_steps(model, attention, scenarios=scen, warmup=1, iters=3, peak_tbps=hbm,
                                                peak_tflops=tflops)
        for r in steps:
            r["pct_of_measured_matmul"] = 100 * r["tflops"] / ceil["matmul_tflops"]
            r["pct_of_measured_copy"] = 100 * r["tbps"] / ceil["copy_tbps"]
            log(f"   step {r['scenario']:22s} {r['kind']:7s} {r['tokens']:6d} tok {r['time_ms']:9.2f} ms "
                f"{r['tflops']:8.3g} TFLOP/s = {r['pct_of_peak_flops']:4.1f} % of nominal "
                f"({r['pct_of_measured_matmul']:4.1f} % of measured matmul); {r['tbps']:7.3g} TB/s = "
                f"{r['pct_of_peak_bw']:4.1f} % of nominal ({r['pct_of_measured_copy']:4.1f} % of measured copy)")
        del model
    else:
        log("   whole steps skipped: time budget spent")
    return {"nominal": {"spec": spec_name, "hbm_tbps": hbm, "bf16_tflops": tflops}, "ceilings": ceil,
            "decode_attention": dec, "steps": steps, "model_shape": spec.name, "dtype": str(dtype), "ok": True}

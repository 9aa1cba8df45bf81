"""One prepared command for a GPU session: the correctness suite on the device, then the speed
benchmark, with every figure written to a results file.

Run from the repository root (``gpu_backend/gpu_check.sh`` sets ``PYTHONPATH`` and calls this)::

    bash gpu_backend/gpu_check.sh                        # CUDA: full check, < 8 minutes on an H200
    bash gpu_backend/gpu_check.sh --device cpu --quick   # CPU smoke test of this script (~10 s)

It needs torch, numpy and pyyaml only -- not simpy or pydantic: the scheduler is driven directly
(``gpu_backend.cases.Harness``), not through the SimPy replay. Output: ``$OUT/gpu_check.json`` (all
figures) and ``$OUT/gpu_check.txt`` (the printed tables), or ``--out DIR``; exit status 0 when every
correctness verdict holds (the speed target is reported, not enforced).

Sections:

1. environment (torch, device, triton, which varlen attention APIs this torch has);
2. correctness, tiny model, on the device: fp32 (``max |dlogit| <= 1e-5``) and bf16 (same top
   token wherever the dense top-2 margin exceeds 0.25, ``KL(dense || cached) <= 1e-2`` nats per
   position), each with ``reference`` attention and with ``auto`` (the fast path chosen at run
   time), all positive cases plus both negative controls (which must FAIL the comparison);
3. (CUDA, not ``--quick``) Llama-3-8B shapes in bf16: prefix hit, chunked prefill + decode and the
   corrupted-block control through the fast path; then the benchmark: measured copy bandwidth and
   matmul rate, decode attention at batch 64 x 4k context (Triton configurations, flash paged at
   block 16 and 256, reference), and whole steps (cold prefill 4 x 2048, prefill after a 3k hit
   4 x 1024, decode 64 x 4k, mixed);
4. the quickstart replay (``configs/quickstart_torch.yaml``) through SimPy on the device, only when
   simpy and pydantic can be imported (carry their wheels to the GPU image, see the README here).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

import torch

from gpu_backend import bench, cases
from gpu_backend.attention import select_attention
from gpu_backend.attention.flash import find_varlen_attn, varlen_takes_block_table
from gpu_backend.model import LlamaModel
from gpu_backend.shapes import TINY, resolve_model_shape


class _Out:
    """Prints and keeps every line for the text report."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def __call__(self, line: str = "") -> None:
        print(line, flush=True)
        self.lines.append(line)


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


def _correctness(out: _Out, model: LlamaModel, attention_req: str, label: str, fill: float,
                 only: list[str] | None = None) -> list[dict[str, Any]]:
    backend, rep = select_attention(attention_req, device=model.device, dtype=model.dtype, block_size=16,
                                    num_heads=model.num_heads, num_kv_heads=model.num_kv_heads,
                                    head_dim=model.head_dim)
    out(f"-- {label}: attention={rep['name']} probes={rep.get('probes', {})}")
    rows = []
    todo = [(n, f, False) for n, f in cases.CASES.items()] + [(n, f, True) for n, f in cases.NEGATIVE_CASES.items()]
    for name, fn, negative in todo:
        if only is not None and name not in only:
            continue
        t0 = time.perf_counter()
        r = fn(model, backend, fill=fill)
        passed = r.passes(model.dtype)
        verdict = (not passed if negative else passed) and bool(r.facts.get("ok_scenario"))
        row = {"suite": label, "case": r.name, "negative_control": negative, "attention": r.attention,
               "dtype": str(model.dtype).replace("torch.", ""), "max_abs_logit_diff": r.max_abs_diff,
               "max_kl": r.max_kl, "top1_mismatches": r.top1_mismatches,
               "top1_flips_near_ties": r.top1_flips_near_ties, "compared": r.num_compared,
               "comparison_passes": passed, "scenario_ok": bool(r.facts.get("ok_scenario")), "verdict": verdict,
               "seconds": round(time.perf_counter() - t0, 2),
               "facts": {k: v for k, v in r.facts.items() if k != "hits"}}
        rows.append(row)
        tag = "OK  " if verdict else "FAIL"
        kind = "(must fail)" if negative else ""
        out(f"  {tag} {r.name:24s} {kind:11s} n={r.num_compared:3d} max|dlogit|={r.max_abs_diff:.2e} "
            f"maxKL={r.max_kl:.1e} top1_mismatch={r.top1_mismatches} ({row['seconds']} s)")
    return rows


def _replay(out: _Out, device: torch.device) -> dict[str, Any]:
    """``apcsim run configs/quickstart_torch.yaml --backend torch --device <device>``, in-process, when
    simpy and pydantic are importable (on the GPU image they must be carried as wheels)."""
    missing = [name for name in ("pydantic", "simpy") if importlib.util.find_spec(name) is None]
    if missing:
        why = f"No module named {missing[0]!r}"
        out(f"   skipped: {why} (carry simpy/pydantic wheels to run it; see gpu_backend/README.md)")
        return {"skipped": why}
    import tempfile

    from gpu_backend.factory import make_torch_executor
    from sim.experiment.config import load_config
    from sim.experiment.run import run_experiment

    root = Path(__file__).resolve().parents[1]
    cfg = load_config(root / "configs" / "quickstart_torch.yaml", [f"backend.device={device.type}"])
    with tempfile.TemporaryDirectory() as tmp:
        result, folder = run_experiment(cfg, out=tmp, progress=False, executor_factory=make_torch_executor)
        meta = json.loads((Path(folder) / "meta.json").read_text())
    s = result.summary
    keys = ("num_requests", "num_steps", "token_hit_rate", "num_preemptions", "ttft_p50_s", "tpot_p50_s",
            "throughput_output_tokens_per_s", "sim_time_s")
    summary = {k: s.get(k) for k in keys}
    out(f"   {json.dumps(summary)}")
    out(f"   attention={meta['executor']['attention']} step_times={json.dumps(meta['executor']['step_times'])}")
    return {"summary": summary, "executor": meta["executor"]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--quick", action="store_true", help="tiny shapes only (the CPU smoke test)")
    ap.add_argument("--out", default=os.environ.get("OUT") or "gpu_check_out", help="folder for the results files")
    ap.add_argument("--budget-s", type=float, default=420.0, help="skip remaining benchmark parts after this")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    args = ap.parse_args(argv)
    t_start = time.perf_counter()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("gpu_check: CUDA requested but not available", file=sys.stderr)
        return 2
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 means fp32 (the 1e-5 check)
    torch.backends.cudnn.allow_tf32 = False
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    out = _Out()
    report: dict[str, Any] = {"env": env_info(device), "args": vars(args)}
    out(f"== environment: {json.dumps(report['env'])}")

    # -- correctness, tiny model ---------------------------------------------------------------
    out("== correctness (tiny model; every kept logit vs a dense recompute without cache)")
    nan = float("nan")
    suites = [("float32", "reference", nan), ("bfloat16", "reference", nan)]
    if device.type == "cuda":
        # fast paths: unwritten slots hold large finite garbage (a kernel may load and mask them)
        suites += [("float32", "auto", 1e4), ("bfloat16", "auto", 1e4)]
    rows: list[dict[str, Any]] = []
    for dt, attn, fill in suites:
        model = LlamaModel(TINY, dtype=getattr(torch, dt), device=device, seed=0)
        rows += _correctness(out, model, attn, f"tiny/{dt}/{attn}", fill)
        del model
    report["correctness"] = rows

    # -- Llama-3-8B shapes + benchmark -----------------------------------------------------------
    big = device.type == "cuda" and not args.quick
    spec = resolve_model_shape("llama-3-8b") if big else TINY
    bdtype = torch.bfloat16 if big else torch.float32
    out(f"== model {spec.name} ({bdtype}) on {device}")
    t0 = time.perf_counter()
    model = LlamaModel(spec, dtype=bdtype, device=device, seed=0)
    if device.type == "cuda":
        torch.cuda.synchronize()
    out(f"   built {model.num_parameters() / 1e9:.2f} B parameters in {time.perf_counter() - t0:.1f} s")
    if big:
        rows = _correctness(out, model, "auto", f"{spec.name}/bfloat16/auto", 1e4,
                            only=["prefix_hit", "chunked_prefill_decode", "corrupt_shared_block"])
        report["correctness"] += rows

    out("== ceilings (measured here)")
    ceil = bench.measure_ceilings(device, quick=not big)
    report["ceilings"] = ceil
    out(f"   copy {ceil['copy_tbps']:.3g} TB/s (nominal H200 {bench.H200_HBM_TBPS}), "
        f"matmul {ceil['matmul_tflops']:.3g} TFLOP/s {ceil['matmul_dtype']} "
        f"(H200 measured ~{bench.H200_BF16_TFLOPS:.0f})")

    out("== decode attention, one layer (bytes = K+V of every context token)")
    if big:
        dims: dict[str, Any] = dict(batch=64, context=4096, num_heads=spec.num_attention_heads,
                                    num_kv_heads=spec.num_kv_heads, head_dim=spec.head_dim, dtype=torch.bfloat16,
                                    device=device)
        impls = ["reference", "flash_paged"] + (["triton"] if _version("triton") else [])
        tcfg = [dict(tile=64, num_warps=4, num_stages=2), dict(tile=128, num_warps=4, num_stages=2),
                dict(tile=64, num_warps=8, num_stages=3), dict(tile=32, num_warps=2, num_stages=3),
                dict(tile=128, num_warps=8, num_stages=2, num_splits=8)]
        dec = bench.bench_decode_attention(impls, block_size=16, triton_configs=tcfg, **dims)
        dec += bench.bench_decode_attention(["flash_paged"], block_size=256, **dims)
    else:
        dims = dict(batch=8, context=256, num_heads=spec.num_attention_heads, num_kv_heads=spec.num_kv_heads,
                    head_dim=spec.head_dim, dtype=bdtype, device=device, warmup=1, iters=3)
        use_triton = _version("triton") and (device.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1")
        dec = bench.bench_decode_attention(["reference"] + (["triton"] if use_triton else []), block_size=16, **dims)
    report["decode_attention"] = dec
    for r in dec:
        if "error" in r:
            out(f"   {r['impl']:44s} bs={r['block_size']:<4d} unavailable: {r['error']}")
        else:
            out(f"   {r['impl']:44s} bs={r['block_size']:<4d} B={r['batch']} ctx={r['context']} "
                f"{r['time_ms']:8.3f} ms {r['tbps']:7.3g} TB/s {r['pct_of_peak']:5.1f}% of {bench.H200_HBM_TBPS} TB/s")
    best = max((r for r in dec if "tbps" in r), key=lambda r: r["tbps"], default=None)
    if best is not None:
        target = best["pct_of_peak"] >= 60.0
        report["decode_attention_target_60pct"] = {"met": target, "best": best["impl"], "pct": best["pct_of_peak"]}
        out(f"   target >= 60% of HBM at batch {best['batch']} x {best['context']}: "
            f"{'MET' if target else 'NOT MET'} (best {best['impl']}, {best['pct_of_peak']:.1f}%)")

    out("== whole steps (all layers + lm_head)")
    if time.perf_counter() - t_start > args.budget_s:
        out("   skipped: time budget spent")
    else:
        attention, rep = select_attention("auto", device=device, dtype=bdtype, block_size=16,
                                          num_heads=spec.num_attention_heads, num_kv_heads=spec.num_kv_heads,
                                          head_dim=spec.head_dim)
        out(f"   attention={rep['name']}")
        if big:
            scen = {"prefill_cold_4x2048": [(0, 2048)] * 4, "prefill_hit3k_4x1024": [(3072, 1024)] * 4,
                    "decode_64x4k": [(4095, 1)] * 64, "mixed_2x512+62x4k": [(2048, 512)] * 2 + [(4095, 1)] * 62}
            steps = bench.bench_model_steps(model, attention, scenarios=scen)
        else:
            scen = {"prefill_cold_2x128": [(0, 128)] * 2, "prefill_hit_2x32": [(96, 32)] * 2,
                    "decode_8x256": [(255, 1)] * 8, "mixed": [(64, 32)] + [(255, 1)] * 4}
            steps = bench.bench_model_steps(model, attention, scenarios=scen, warmup=1, iters=3)
        report["steps"] = steps
        for r in steps:
            out(f"   {r['scenario']:22s} {r['kind']:7s} {r['tokens']:6d} tok {r['time_ms']:9.2f} ms "
                f"{r['tflops']:8.3g} TFLOP/s ({r['pct_of_peak_flops']:4.1f}% of {bench.H200_BF16_TFLOPS:.0f})  "
                f"{r['tbps']:7.3g} TB/s ({r['pct_of_peak_bw']:4.1f}% of {bench.H200_HBM_TBPS})")
    del model
    if device.type == "cuda":
        torch.cuda.empty_cache()

    out("== replay of configs/quickstart_torch.yaml through SimPy + scheduler + TorchExecutor")
    report["replay"] = _replay(out, device)

    ok = all(r["verdict"] for r in report["correctness"])
    report["all_correctness_verdicts_hold"] = ok
    report["seconds"] = round(time.perf_counter() - t_start, 1)
    out(f"== correctness {'PASSED' if ok else 'FAILED'}; total {report['seconds']} s")
    (out_dir / "gpu_check.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
    (out_dir / "gpu_check.txt").write_text("\n".join(out.lines) + "\n")
    print(f"wrote {out_dir}/gpu_check.json and gpu_check.txt")
    return 0 if ok else 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

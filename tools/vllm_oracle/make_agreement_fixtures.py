#!/usr/bin/env python3
"""Regenerate ``tests/fixtures/vllm_oracle/``: deterministic canonical traces, vLLM 0.25.1's
expected outputs (from ``oracle.py``, one ``--batch`` process) and ``manifest.json``.
With ``--vllm-version 0.33.0``: the same cases through vLLM 0.33.0 (``venv033``) into
``tests/fixtures/vllm_oracle_033/`` -- the traces are not copied there: its manifest names them as
``../vllm_oracle/<trace>.jsonl`` (checked byte-identical to what this script generates), and its
CSVs carry three more columns (``external_hit_tokens, readmit_external_hit_tokens,
steps_waiting_for_kv``; all 0 / empty without a KV connector).

DEV-ONLY. Needs the oracle venv (``setup.sh``); apcsim itself never imports this file.

    cd tools/vllm_oracle && ./setup.sh
    venv/bin/python make_agreement_fixtures.py [--out ../../tests/fixtures/vllm_oracle]
    ./setup.sh --version 0.33.0 && python3 make_agreement_fixtures.py --vllm-version 0.33.0

Traces are generated here with ``random.Random(seed)`` (standard library only), so the same
script gives byte-identical traces; the expected outputs are whatever vLLM computes for them.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT_OUT = HERE.parent.parent / "tests" / "fixtures" / "vllm_oracle"
DEFAULT_OUT_033 = HERE.parent.parent / "tests" / "fixtures" / "vllm_oracle_033"


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


# ------------------------------------------------------------------------------------------------
# trace generators
# ------------------------------------------------------------------------------------------------
class Tokens:
    """Fresh, never-repeating token ids (small numbers keep the JSON compact)."""

    def __init__(self, start: int = 10):
        self.next = start

    def take(self, n: int) -> list[int]:
        out = list(range(self.next, self.next + n))
        self.next += n
        return out


def chat_trace(seed: int, *, sessions: int, turns: tuple[int, int], system_len: tuple[int, ...],
               user_len: tuple[int, int], out_len: tuple[int, int], think: float, start_gap: float,
               max_context: int, salts=(None,), loras=(None,), plp_frac: float = 0.0,
               priorities=(0,), burst_frac: float = 0.0, extras: int = 0, block_size: int = 16) -> list[dict]:
    """Multi-turn chats: turn k+1 = turn k's prompt + its ``output_token_ids`` + a new user message.

    Sessions share one of a few system prompts; a session has one salt / LoRA (a tenant). Some
    sessions start at exactly the same instant as the previous one (``burst_frac``). ``extras``
    one-off requests probe edge cases: 1-token prompts, prompts of exactly k blocks, max_tokens=1
    and exact repeats of an earlier prompt.
    """
    rng = random.Random(seed)
    tok = Tokens()
    systems = [tok.take(n) for n in system_len]
    reqs: list[dict] = []
    t0 = 0.0
    for s in range(sessions):
        if s and rng.random() >= burst_frac:
            t0 += rng.expovariate(1 / start_gap)
        t = t0
        salt = rng.choice(salts)
        lora = rng.choice(loras)
        prompt = list(rng.choice(systems))
        for k in range(rng.randint(*turns)):
            prompt = prompt + tok.take(rng.randint(*user_len))
            if len(prompt) > max_context:
                break
            n_out = rng.randint(*out_len)
            r = {"id": f"s{s}t{k}", "arrival": round(t, 6), "tokens": prompt, "output_tokens": n_out,
                 "output_token_ids": tok.take(n_out)}
            if salt is not None:
                r["salt"] = salt
            if lora is not None:
                r["lora"] = lora
            if rng.random() < plp_frac:
                r["prompt_logprobs"] = True
            p = rng.choice(priorities)
            if p:
                r["priority"] = p
            reqs.append(r)
            prompt = prompt + r["output_token_ids"]
            t += rng.expovariate(1 / think) if think > 0 else 0.0
    # edge-case one-offs
    horizon = max(r["arrival"] for r in reqs)
    for e in range(extras):
        kind = e % 4
        if kind == 0:
            tokens = tok.take(1)
        elif kind == 1:
            tokens = list(rng.choice(systems)) + tok.take(block_size * rng.randint(1, 3))
            tokens = tokens[: (len(tokens) // block_size) * block_size] or tokens
        elif kind == 2:
            tokens = list(rng.choice(reqs)["tokens"])  # exact repeat
        else:
            tokens = list(rng.choice(systems)) + tok.take(rng.randint(1, 40))
        r = {"id": f"x{e}", "arrival": round(rng.uniform(0, horizon), 6), "tokens": tokens,
             "output_tokens": 1 if kind != 3 else rng.randint(1, 8)}
        p = rng.choice(priorities)
        if p:
            r["priority"] = p
        reqs.append(r)
    reqs.sort(key=lambda r: r["arrival"])  # stable: ties keep generation order
    return reqs


TRACES = {
    # 16-token-block friendly chat traffic with tenants: salts (incl. ""), LoRA, prompt_logprobs
    "chat_mixed": dict(seed=11, sessions=40, turns=(1, 5), system_len=(200, 330, 97), user_len=(5, 120),
                       out_len=(1, 60), think=0.4, start_gap=0.15, max_context=1400,
                       salts=(None, None, "", "tenantA", "tenantB"), loras=(None, None, "loraX"),
                       plp_frac=0.08, priorities=(0, 0, 1, 2), burst_frac=0.25, extras=16),
    # short prompts for tiny block sizes (1/2/3) and odd ones (17)
    "chat_short": dict(seed=22, sessions=30, turns=(1, 4), system_len=(24, 41), user_len=(1, 20),
                       out_len=(1, 12), think=0.05, start_gap=0.03, max_context=160,
                       salts=(None, "", "t1"), loras=(None, "L1"), plp_frac=0.1, priorities=(0, 1, 2, -1),
                       burst_frac=0.3, extras=12, block_size=3),
    # everything at once (same timestamp) with long shared prefixes, for bs 64 / 128
    "burst_long": dict(seed=33, sessions=24, turns=(1, 3), system_len=(700, 384), user_len=(10, 300),
                       out_len=(1, 40), think=0.0, start_gap=1.0, max_context=2200,
                       salts=(None,), loras=(None,), plp_frac=0.0, priorities=(0, 1), burst_frac=1.0,
                       extras=8, block_size=128),
}


def need_len(trace: list[dict]) -> int:
    return max(len(r["tokens"]) + r["output_tokens"] for r in trace)


def min_pool(trace: list[dict], bs: int, mml: int) -> int:
    """Smallest pool apcsim accepts that also guarantees progress: one max_model_len sequence,
    and the largest request's prompt+output (+1 async placeholder) plus one block."""
    return max(cdiv(mml, bs), max(cdiv(len(r["tokens"]) + r["output_tokens"] + 1, bs) for r in trace) + 1)


# name: (trace, engine settings; "pool" is added to min_pool unless "num_gpu_blocks" is given)
CASES = {
    "chat_bs16_sync_fcfs_small_pool": ("chat_mixed", dict(block_size=16, pool=8, max_num_batched_tokens=512)),
    "chat_bs16_async_fcfs_small_pool": ("chat_mixed", dict(block_size=16, pool=8, max_num_batched_tokens=512,
                                                          async_scheduling=True)),
    "chat_bs16_sync_fcfs_nochunk": ("chat_mixed", dict(block_size=16, pool=30, enable_chunked_prefill=False,
                                                      max_num_seqs=8)),
    "chat_bs64_async_priority_watermark": ("chat_mixed", dict(block_size=64, pool=6, watermark=0.05,
                                                             policy="priority", async_scheduling=True,
                                                             max_num_batched_tokens=256)),
    "chat_bs16_sync_priority_generous": ("chat_mixed", dict(block_size=16, pool=4000, policy="priority",
                                                           max_num_seqs=16)),
    "short_bs1_sync_fcfs_threshold": ("chat_short", dict(block_size=1, pool=40, long_prefill_token_threshold=7,
                                                        max_num_batched_tokens=64, max_num_seqs=4)),
    "short_bs2_async_priority": ("chat_short", dict(block_size=2, pool=10, policy="priority",
                                                   async_scheduling=True, max_num_batched_tokens=48,
                                                   max_num_seqs=3)),
    "short_bs3_sync_fcfs_watermark": ("chat_short", dict(block_size=3, pool=4, watermark=0.1,
                                                        long_prefill_token_threshold=5,
                                                        max_num_batched_tokens=32, max_num_seqs=4)),
    "short_bs17_async_fcfs_nochunk": ("chat_short", dict(block_size=17, pool=3, enable_chunked_prefill=False,
                                                        async_scheduling=True, max_num_seqs=2)),
    "burst_bs128_sync_fcfs": ("burst_long", dict(block_size=128, pool=3, max_num_batched_tokens=1024)),
    "burst_bs64_async_priority_threshold": ("burst_long", dict(block_size=64, pool=10, policy="priority",
                                                              async_scheduling=True,
                                                              long_prefill_token_threshold=200)),
    # Regression (found by fuzzing, fixed in 4bb9990): synchronous priority scheduling where the
    # worst running request must preempt itself -> vLLM runs one empty step.
    "repro_sync_priority_self_preempt": ("repro_self_preempt", dict(block_size=16, num_gpu_blocks=5,
                                                                   policy="priority")),
}

# hand-made traces: (id, arrival, prompt length, output tokens, priority), distinct tokens
HAND = {
    "repro_self_preempt": [("A", 0.0, 31, 3, 2), ("B", 0.005, 32, 2, 0)],
}


def hand_trace(rows) -> list[dict]:
    tok = Tokens(100)
    out = []
    for rid, arrival, n, o, prio in rows:
        r = {"id": rid, "arrival": arrival, "tokens": tok.take(n), "output_tokens": o}
        if prio:
            r["priority"] = prio
        out.append(r)
    return out


def engine_settings(trace: list[dict], s: dict) -> dict:
    s = dict(s)
    bs = s["block_size"]
    need = need_len(trace)
    e = dict(block_size=bs, max_num_batched_tokens=8192, max_num_seqs=256, max_model_len=need,
             enable_chunked_prefill=True, long_prefill_token_threshold=0, watermark=0.0, policy="fcfs",
             async_scheduling=False, step_time=0.01)
    extra = s.pop("pool", 0)
    e.update(s)
    if not e["enable_chunked_prefill"]:
        e["max_num_batched_tokens"] = max(e["max_num_batched_tokens"], e["max_model_len"])
    e.setdefault("num_gpu_blocks", min_pool(trace, bs, e["max_model_len"]) + extra)
    return e


def oracle_argv(trace_rel: str, name: str, e: dict) -> list[str]:
    argv = [trace_rel, "--out", f"{name}.csv", "--stats-out", f"{name}.stats.json",
            "--block-size", e["block_size"], "--num-gpu-blocks", e["num_gpu_blocks"],
            "--max-model-len", e["max_model_len"], "--max-num-batched-tokens", e["max_num_batched_tokens"],
            "--max-num-seqs", e["max_num_seqs"], "--policy", e["policy"],
            "--long-prefill-token-threshold", e["long_prefill_token_threshold"], "--watermark", e["watermark"],
            "--step-time", e["step_time"], "--hash-algo", "sha256", "--hash-seed", "0", "--quiet",
            # a step that schedules nothing takes no time (no forward pass; apcsim's convention too)
            "--free-empty"]
    if not e["enable_chunked_prefill"]:
        argv.append("--no-chunked-prefill")
    if e["async_scheduling"]:
        # --free-drain: the drain-only iteration before the engine goes idle takes no time and is
        # not a step (apcsim's convention; the hits are the same either way)
        argv += ["--async", "--free-drain"]
    return [str(x) for x in argv]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vllm-version", default="0.25.1", choices=["0.25.1", "0.33.0"])
    ap.add_argument("--out", default=None, help="default: tests/fixtures/vllm_oracle (0.25.1) or "
                    "tests/fixtures/vllm_oracle_033 (0.33.0)")
    ap.add_argument("--python", default=None, help="the oracle venv's python (default: venv/ or venv033/)")
    a = ap.parse_args()
    v033 = a.vllm_version != "0.25.1"
    out = Path(a.out or (DEFAULT_OUT_033 if v033 else DEFAULT_OUT))
    python = a.python or str(HERE / ("venv033" if v033 else "venv") / "bin" / "python")
    out.mkdir(parents=True, exist_ok=True)
    # 0.33: the traces stay in ../vllm_oracle (same generator, same bytes); written to a scratch
    # folder here for the oracle and compared with the committed ones
    trace_dir = out / "_traces" if v033 else out
    trace_dir.mkdir(exist_ok=True)
    trace_ref = (lambda t: f"../vllm_oracle/{t}.jsonl") if v033 else (lambda t: f"{t}.jsonl")
    traces = {}
    for tname, kw in [*TRACES.items(), *HAND.items()]:
        tr = chat_trace(**kw) if isinstance(kw, dict) else hand_trace(kw)
        traces[tname] = tr
        with open(trace_dir / f"{tname}.jsonl", "w") as f:
            for r in tr:
                f.write(json.dumps(r, separators=(",", ":")) + "\n")
        if v033:
            ref = (out / trace_ref(tname)).read_bytes()
            if ref != (trace_dir / f"{tname}.jsonl").read_bytes():
                print(f"{tname}: differs from {trace_ref(tname)}; regenerate 0.25.1 first", file=sys.stderr)
                return 1
    manifest = {"vllm_version": a.vllm_version, "oracle": "tools/vllm_oracle/oracle.py",
                "generator": "tools/vllm_oracle/make_agreement_fixtures.py"
                + (" --vllm-version 0.33.0" if v033 else ""), "cases": {}}
    jobs = []
    for name, (tname, s) in CASES.items():
        e = engine_settings(traces[tname], s)
        argv = oracle_argv(f"{tname}.jsonl", name, e)
        if v033:
            argv[0] = f"_traces/{tname}.jsonl"
        jobs.append({"name": name, "argv": argv})
        manifest["cases"][name] = {
            "trace": trace_ref(tname), "expected_csv": f"{name}.csv", "expected_stats": f"{name}.stats.json",
            "engine": e,
            "oracle_command": "python oracle.py " + " ".join(shlex.quote(x) for x in
                                                             [trace_ref(tname), *argv[1:]]),
        }
    jobs_path = out / "_jobs.jsonl"
    with open(jobs_path, "w") as f:
        for j in jobs:
            f.write(json.dumps(j) + "\n")
    env = dict(os.environ, VLLM_LOGGING_LEVEL="ERROR")
    rep = subprocess.run([python, str(HERE / "oracle.py"), "--batch", jobs_path.name, "--quiet"], cwd=out,
                         env=env, capture_output=True, text=True)
    jobs_path.unlink()
    if v033:
        shutil.rmtree(trace_dir)
    failed = False
    for line in rep.stdout.splitlines():
        if line.startswith("{"):
            r = json.loads(line)
            print(r["name"], "ok" if r["ok"] else r["error"], r.get("summary", ""))
            failed |= not r["ok"]
    if rep.returncode or failed:
        print(rep.stderr[-3000:], file=sys.stderr)
        return 1
    for name in CASES:  # keep only what the test reads (drop timings that vary run to run)
        p = out / f"{name}.stats.json"
        st = json.load(open(p))
        st.pop("build_seconds", None)
        st.pop("replay_seconds", None)
        json.dump(st, open(p, "w"), indent=1, sort_keys=True)
        p.write_text(p.read_text() + "\n")
    with open(out / "manifest.json", "w") as f:
        json.dump(manifest, f, indent=1)
        f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

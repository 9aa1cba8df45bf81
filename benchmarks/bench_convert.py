"""Benchmark: ``apcsim convert`` of a generated OpenAI chat log, in lines per second (issue 35's
target: >= 20,000 lines/s for 100,000 lines with the trained test tokenizer).

The log is generated with a fixed seed: each line a chat-completions record with a system prompt
(one of 20), 1 to 3 user turns with the earlier answers, 5 to 40 words per message, an epoch
``created`` and ``usage.completion_tokens``. The tokenizer is the tests' (a byte-level BPE of
600 ids trained at run time on generated text, and a Llama-3-style chat template:
``tests/convert_tokenizer.py``). Prints the lines, requests, tokens and the rate of the conversion
alone (generation and training not counted); CPU time beside wall time, since the tokenizer may
use more than one thread.

    python benchmarks/bench_convert.py [--lines 100000] [--turns all|last] [--workers N] [--keep DIR]

CPU time is the converting process's own (``--workers``: the workers' time is not in it).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from convert_tokenizer import make_model_folder, sentence

from workloads.convert.writer import ConvertOptions, convert


def write_log(path: Path, lines: int, seed: int = 0) -> None:
    rng = random.Random(seed)
    systems = [sentence(rng, rng.randint(10, 40)) for _ in range(20)]
    t0 = 1_765_000_000.0
    with open(path, "w", encoding="utf-8") as fh:
        for i in range(lines):
            msgs = [{"role": "system", "content": rng.choice(systems)}]
            for _ in range(rng.randint(1, 3)):
                msgs.append({"role": "user", "content": sentence(rng, rng.randint(5, 40))})
                msgs.append({"role": "assistant", "content": sentence(rng, rng.randint(5, 40))})
            msgs.pop()
            rec = {"model": "test-model", "messages": msgs, "created": round(t0 + i * 0.05, 3),
                   "usage": {"prompt_tokens": 0, "completion_tokens": rng.randint(5, 200)}}
            fh.write(json.dumps(rec) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lines", type=int, default=100_000)
    ap.add_argument("--turns", choices=("all", "last"), default="all")
    ap.add_argument("--workers", type=int, default=1, help="convert --workers (processes)")
    ap.add_argument("--keep", type=Path, default=None, help="keep the log, model folder and output here")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.keep or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        model = make_model_folder(folder / "model")
        log = folder / "chat_log.jsonl"
        write_log(log, args.lines)
        out = folder / "trace.jsonl"
        wall, cpu = time.perf_counter(), time.process_time()
        s = convert(log, out, ConvertOptions(format="openai", tokenizer=str(model), turns=args.turns,
                                             progress=False, workers=args.workers))
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        size = log.stat().st_size / 1e6
        print(f"convert openai, {args.lines:,} lines ({size:.1f} MB), turns={args.turns}, workers={args.workers}: "
              f"{s.requests:,} requests, "
              f"{s.prompt_tokens:,} prompt tokens")
        print(f"wall {wall:.2f} s, cpu {cpu:.2f} s: {args.lines / wall:,.0f} lines/s "
              f"({s.requests / wall:,.0f} requests/s, {size / wall:.1f} MB/s; target >= 20,000 lines/s); "
              f"{args.lines / cpu:,.0f} lines per CPU-second")


if __name__ == "__main__":
    main()

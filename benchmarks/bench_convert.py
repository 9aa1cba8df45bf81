"""Benchmark: ``apcsim convert`` of a generated OpenAI chat log, in lines per second (issue 35's
target: >= 20,000 lines/s for 100,000 lines with the trained test tokenizer).

Two generated logs (fixed seeds; see the writers below):

* ``sessions`` (the default): a production-style log, one line per API call carrying the whole
  history (a proxy's log of chat-completions calls), converted with ``--turns last`` (one request
  per line, as docs/convert.md advises for such logs): conversations of 1-12 calls interleaved,
  40 shared system prompts of 20-400 words, tool lists on 30% of them, user messages of 5-150 words,
  answers of 10-250 in ``choices`` with ``usage``; about 6.3 kB a line.
* ``independent``: the first benchmark's log, independent records of 1-3 user turns with the
  earlier answers (5-40 words a message, 20 short system prompts), converted with ``--turns all``;
  about 850 B a line.

The tokenizer is the tests' (a byte-level BPE of 600 ids trained at run time on generated text, and
a Llama-3-style chat template: ``tests/convert_tokenizer.py``). Three paths, alternated in one run
and writing the same bytes (checked here): ``reference``, the former serialization
(``ConvertOptions(reference=True)``: ids as lists and arrays, one ``request_to_json`` per request);
``fast``, the serialized segment cache without the word cache (``words=False``: the library
tokenizes every new piece whole); ``words``, the current default (new pieces cut into words, the
library tokenizing only new words: ``workloads.convert.word_cache``). ``fast`` and ``words`` render a
chat template of the split shape per message (``workloads.convert.template_parts``), ``reference``
renders it whole per turn. ``--path all`` runs the
three, ``--path both`` ``fast`` and ``words``.
Prints per run the lines, requests, tokens, wall and CPU seconds (``getrusage``: this process, the
tokenizer's threads and ``--workers`` processes, so that other programs' load on a shared box does
not count), lines/s wall and lines per CPU-second, whether the target is met on this machine, and
how many fully used cores the target needs at the measured lines per CPU-second; with ``--workers``
also the converting process's own CPU per line (``us_per_line_main``: reading, ordering and writing,
which no worker shares -- the rate cannot pass one line per that time, however many cores).

    python benchmarks/bench_convert.py [--lines 100000] [--log sessions|independent|both]
        [--path reference|fast|words|both|all] [--repeat N] [--workers N] [--keep DIR] [--out DIR]

``--out DIR`` keeps the figures as a results folder, replaced whole (``bench_results``):
``runs.json``, ``rows.json``, ``table.md`` and ``meta.json`` (commit, versions, CPU, load averages,
the arguments).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import resource
import sys
import tempfile
import time
from importlib.metadata import version
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from bench_results import BenchFolder, compile_bytecode, run_with_folder
from convert_tokenizer import make_model_folder, sentence

from workloads.convert.writer import ConvertOptions, convert


def write_independent_log(path: Path, lines: int, seed: int = 0) -> None:
    """The first benchmark's log: independent records, each a system prompt (one of 20, 10-40 words)
    and 1-3 user turns with the earlier answers (5-40 words a message); convert with ``--turns all``."""
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


def _paragraph(rng: random.Random, words: int) -> str:
    out, left = [], words
    while left > 0:
        n = min(left, rng.randint(5, 25))
        out.append(sentence(rng, n))
        left -= n
    return " ".join(out)


def _tool(rng: random.Random, k: int) -> dict[str, object]:
    props = {f"arg_{j}": {"type": rng.choice(["string", "integer", "boolean"]),
                          "description": sentence(rng, rng.randint(4, 12))} for j in range(rng.randint(1, 4))}
    return {"type": "function", "function": {
        "name": f"tool_{k}", "description": _paragraph(rng, rng.randint(10, 40)),
        "parameters": {"type": "object", "properties": props, "required": sorted(props)[:1]}}}


def write_session_log(path: Path, lines: int, seed: int = 0) -> None:
    """A production-style chat-completions log: one line per API call, each carrying the whole
    history (what a logging proxy in front of an OpenAI-compatible server records); convert with
    ``--turns last``. Conversations of 1-12 calls (1 + geometric, mean 3.3) start at 2 per second
    and call again after an exponential 20 s think time, so about 130 are open at once and their
    lines interleave; each uses one of 40 system prompts (20-400 words) and 30% carry one of 8 tool
    lists (1-4 functions with JSON-schema parameters); user messages have 5-150 words, answers
    10-250 (in ``choices[0].message.content``, with ``usage.completion_tokens``), and the next call
    resends that answer as the assistant message."""
    rng = random.Random(seed)
    systems = [_paragraph(rng, rng.randint(20, 400)) for _ in range(40)]
    toolsets = [[_tool(rng, 8 * t + k) for k in range(rng.randint(1, 4))] for t in range(8)]
    t0 = 1_765_000_000.0
    events: list[tuple[float, int, int]] = []  # (time, conversation, call)
    convs: list[tuple[int, int | None, int]] = []  # (system, toolset, calls)
    start, conv = t0, 0
    while len(events) < lines:
        calls = 1
        while calls < 12 and rng.random() > 0.3:
            calls += 1
        convs.append((rng.randrange(len(systems)), rng.randrange(len(toolsets)) if rng.random() < 0.3 else None,
                      calls))
        t = start
        for k in range(calls):
            events.append((t, conv, k))
            t += rng.expovariate(1 / 20)
        start += rng.expovariate(2.0)
        conv += 1
    events.sort()
    history: dict[int, list[dict[str, str]]] = {}
    with open(path, "w", encoding="utf-8") as fh:
        for t, c, k in events[:lines]:
            system, toolset, calls = convs[c]
            msgs = history.setdefault(c, [{"role": "system", "content": systems[system]}])
            msgs.append({"role": "user", "content": _paragraph(rng, rng.randint(5, 150))})
            words = rng.randint(10, 250)
            answer = _paragraph(rng, words)
            rec: dict[str, object] = {"id": f"chatcmpl-{c}-{k}", "model": "test-model", "user": f"user{c % 97}",
                                      "messages": msgs, "created": round(t, 3)}
            if toolset is not None:
                rec["tools"] = toolsets[toolset]
            rec["choices"] = [{"index": 0, "message": {"role": "assistant", "content": answer},
                               "finish_reason": "stop"}]
            rec["usage"] = {"prompt_tokens": 0, "completion_tokens": round(words * 1.3)}
            fh.write(json.dumps(rec) + "\n")
            msgs.append({"role": "assistant", "content": answer})
            if k == calls - 1:
                del history[c]


LOGS = {"sessions": (write_session_log, "last"), "independent": (write_independent_log, "all")}


TARGET = 20_000  # lines/s (issue 35)


def _cpu_s() -> tuple[float, float]:
    """CPU seconds of this process (its threads included) and of it with its waited-for children."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    mine = own.ru_utime + own.ru_stime
    return mine, mine + kids.ru_utime + kids.ru_stime


PATHS: dict[str, dict[str, Any]] = {
    "reference": {"reference": True}, "fast": {"words": False}, "words": {"words": True}}
"""The options of each path (see the module docstring)."""
PATH_SETS = {"both": ["fast", "words"], "all": ["reference", "fast", "words"]}


def _run(log: Path, out: Path, model: Path, turns: str, path: str, workers: int) -> dict[str, Any]:
    wall, (main, cpu) = time.perf_counter(), _cpu_s()
    s = convert(log, out, ConvertOptions(format="openai", tokenizer=str(model), turns=turns,  # type: ignore[arg-type]
                                         progress=False, workers=workers, **PATHS[path]))
    end = _cpu_s()
    wall, main, cpu = time.perf_counter() - wall, end[0] - main, end[1] - cpu
    lines = s.records + s.rejected_lines
    return {"path": path, "lines": lines, "requests": s.requests,
            "prompt_tokens": s.prompt_tokens, "wall_s": round(wall, 3), "cpu_s": round(cpu, 3),
            "lines_per_s": round(lines / wall), "lines_per_cpu_s": round(lines / cpu),
            "us_per_line_cpu": round(cpu / lines * 1e6, 1), "us_per_line_main": round(main / lines * 1e6, 1),
            "sha256": hashlib.sha256(out.read_bytes()).hexdigest()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lines", type=int, default=100_000)
    ap.add_argument("--log", choices=("sessions", "independent", "both"), default="sessions")
    ap.add_argument("--path", choices=(*PATHS, *PATH_SETS), default="all")
    ap.add_argument("--repeat", type=int, default=1, help="alternated runs of each path (the best CPU time kept)")
    ap.add_argument("--workers", type=int, default=1, help="convert --workers (processes)")
    ap.add_argument("--keep", type=Path, default=None, help="keep the logs, model folder and outputs here")
    ap.add_argument("--out", default=None, help="also keep the figures as this results folder (replaced whole)")
    args = ap.parse_args()
    run_with_folder(args.out, ("runs.json", "rows.json", "table.md").__contains__, lambda f: _bench(args, f))


def _bench(args: argparse.Namespace, folder: BenchFolder | None) -> None:
    compile_bytecode()
    logs = ["sessions", "independent"] if args.log == "both" else [args.log]
    paths = PATH_SETS.get(args.path, [args.path])
    runs: list[dict[str, Any]] = []
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        where = args.keep or Path(tmp)
        where.mkdir(parents=True, exist_ok=True)
        model = make_model_folder(where / "model")
        for name in logs:
            write, turns = LOGS[name]
            log = where / f"{name}_{args.lines}.jsonl"
            write(log, args.lines)
            size = log.stat().st_size / 1e6
            best: dict[str, dict[str, Any]] = {}
            for _ in range(args.repeat):
                for path in paths:
                    row = {"log": name, "turns": turns, "mb": round(size, 1), "workers": args.workers,
                           **_run(log, where / f"{name}.out.jsonl", model, turns, path, args.workers)}
                    runs.append(row)
                    print(json.dumps(row), flush=True)
                    if row["path"] not in best or row["cpu_s"] < best[row["path"]]["cpu_s"]:
                        best[row["path"]] = row
            if len({r["sha256"] for r in best.values()}) > 1:
                raise SystemExit(f"{name}: the paths wrote different traces")
            for r in best.values():
                r["cpu_ratio"] = round(r["cpu_s"] / next(iter(best.values()))["cpu_s"], 3)
                r["cores_for_target"] = round(TARGET / r["lines_per_cpu_s"], 1)
                r["target"] = "met" if r["lines_per_s"] >= TARGET else "missed"
                rows.append(r)
    keys = ["log", "turns", "mb", "path", "workers", "lines", "requests", "prompt_tokens", "wall_s", "cpu_s",
            "lines_per_s", "lines_per_cpu_s", "us_per_line_cpu", "us_per_line_main", "cpu_ratio", "cores_for_target",
            "target"]
    table = "| " + " | ".join(keys) + " |\n|" + "---|" * len(keys) + "\n"
    table += "".join("| " + " | ".join(str(r[k]) for k in keys) + " |\n" for r in rows)
    print("\n" + table, end="")
    for r in rows:
        print(f"{r['log']} {r['path']}: {r['lines_per_s']:,} lines/s wall, {r['lines_per_cpu_s']:,} lines per "
              f"CPU-second: target >= {TARGET:,} lines/s {r['target'].upper()} on this machine "
              f"({os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}); at this CPU cost it needs "
              f"{r['cores_for_target']} fully used cores")
    if folder is not None:
        meta = {"benchmark": "bench_convert", "lines": args.lines, "log": args.log, "path": args.path,
                "repeat": args.repeat, "workers": args.workers, "target_lines_per_s": TARGET,
                "tokenizers": version("tokenizers"), "jinja2": version("jinja2"), "msgspec": version("msgspec"),
                "cpu_count": os.cpu_count()}
        print(f"results folder: {folder.write({'runs.json': runs, 'rows.json': rows, 'table.md': table}, meta)}")


if __name__ == "__main__":
    main()

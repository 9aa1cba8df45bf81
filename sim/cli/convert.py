"""``apcsim convert`` and ``apcsim anonymize`` (mirrors nothing in vLLM): parse, call the converter
in ``workloads.convert`` / ``workloads.hashed_trace``, print a summary.

``apcsim convert INPUT --format F --tokenizer T --out OUT.jsonl`` writes apcsim's canonical trace
from a chat log (``openai``), a ShareGPT list (``sharegpt``), a ``vllm bench serve`` custom file
(``vllm-bench``) or a hash-id trace (``mooncake``, ``bailian``); ``apcsim anonymize TRACE
--block-size B --salt SECRET --out OUT.jsonl`` writes a shareable hashed trace. docs/convert.md
tells the whole story. Errors are one line (``sim.cli.main``). Imports neither simpy nor torch.
"""

from __future__ import annotations

import argparse
from typing import Any

from workloads.convert.conversation import TurnMode
from workloads.convert.timestamps import TIMESTAMP_MODES
from workloads.convert.writer import FORMATS, TEXT_FORMATS, ConvertOptions, ConvertSummary, convert
from workloads.hashed_trace import anonymize


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an int >= 1, got {value}")
    return value


def _workers(text: str) -> int | None:
    return None if text == "auto" else _positive(text)


def _seconds(text: str) -> float:
    value = float(text)
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"expected seconds >= 0, got {text}")
    return value


def describe(s: ConvertSummary, out: str) -> str:
    """The human summary of a conversion (what the CLI prints)."""
    lines = [f"converted {s.source} ({s.format}, {s.records:,} records) -> {out}: {s.requests:,} requests, "
             f"{s.prompt_tokens:,} prompt tokens, {s.output_tokens:,} output tokens"]
    if s.format in TEXT_FORMATS:
        approx = "  APPROXIMATE: byte-level stand-in, hit rates approximate" if s.approximate else ""
        lines.append(f"tokenizer   {s.tokenizer} (fingerprint {s.tokenizer_fingerprint}){approx}")
    if s.timestamps == "none":
        lines.append("timestamps  none: every arrival is 0; the replay's arrival process (workload.arrival in the "
                     "config) places the requests")
    else:
        lines.append(f"timestamps  span {s.span_s:,.1f} s" + (" (sorted by arrival)" if s.reordered else ""))
    if s.default_output_requests:
        lines.append(f"outputs     {s.default_output_requests:,} requests had no answer length: "
                     "--default-output-tokens used")
    if s.template_uses_clock:
        lines.append("template    calls strftime_now: prompts carry today's date (as vLLM's server would today)")
    if s.rejected_lines:
        shown = ", ".join(str(n) for n in s.rejected_line_numbers)
        lines.append(f"rejected    {s.rejected_lines:,} lines (lines {shown}); the first: {s.first_rejection}")
    return "\n".join(lines)


def _cmd_convert(args: argparse.Namespace) -> int:
    turns: TurnMode = args.turns
    opts = ConvertOptions(
        format=args.format, tokenizer=args.tokenizer, timestamps=args.timestamps, turns=turns,
        turn_gap_s=args.turn_gap, default_output_tokens=args.default_output_tokens,
        chat_template=not args.no_chat_template, skip_bad_lines=args.skip_bad_lines,
        progress=False if args.no_progress else None, workers=args.workers,
    )
    print(describe(convert(args.input, args.out, opts), args.out))
    return 0


def _cmd_anonymize(args: argparse.Namespace) -> int:
    s = anonymize(args.trace, args.out, block_size=args.block_size, secret=args.salt,
                  skip_bad_lines=args.skip_bad_lines)
    skipped = f"; {s.skipped_lines:,} bad lines skipped" if s.skipped_lines else ""
    print(f"anonymized {args.trace} -> {args.out}: {s.requests:,} requests, {s.blocks:,} block hashes at block "
          f"size {s.block_size}{skipped}; replay it at block size {s.block_size} or a multiple of it")
    return 0


def add_convert_parsers(sub: Any) -> None:
    """Register ``convert`` and ``anonymize`` on the ``apcsim`` subparsers."""
    p = sub.add_parser("convert", help="turn a chat log, benchmark dataset or hash-id trace into apcsim's trace")
    p.add_argument("input", help="the input file (.gz/.xz/.zst read too)")
    p.add_argument("--format", required=True, choices=FORMATS)
    p.add_argument("--tokenizer", default=None,
                   help="a local tokenizer.json or HF model folder (tokenizer.json + tokenizer_config.json), "
                        "or 'approx' for a byte-level stand-in; nothing is downloaded")
    p.add_argument("--out", required=True, help="the canonical trace to write (JSONL)")
    p.add_argument("--timestamps", choices=TIMESTAMP_MODES, default="auto",
                   help="how to read created/timestamp: auto (ISO-8601 string, epoch s or ms by size), iso, s, ms, "
                        "or none (the replay's arrival process places requests)")
    p.add_argument("--turns", choices=("all", "last", "first"), default="all",
                   help="all: one request per assistant turn (default); last: one request per record (logs that "
                        "hold every call); first: the first turn only (vllm bench's ShareGPT)")
    p.add_argument("--turn-gap", type=_seconds, default=10.0,
                   help="seconds between the turns of one record (its timestamp is the last turn's; default 10)")
    p.add_argument("--default-output-tokens", type=_positive, default=256,
                   help="output length of a turn with no answer text or count (default 256, as vllm bench)")
    p.add_argument("--no-chat-template", action="store_true",
                   help="vllm-bench: tokenize the prompt as is (vllm bench --custom-skip-chat-template)")
    p.add_argument("--skip-bad-lines", action="store_true",
                   help="reject a bad record alone and count it (header and summary) instead of stopping")
    p.add_argument("--workers", type=_workers, default=None, metavar="N|auto",
                   help="processes converting batches of records (default auto: 1 below 32 MB of input, else "
                        "one per core but one, at most 8); the output is the same for any N")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=_cmd_convert)
    a = sub.add_parser("anonymize", help="write a shareable hashed trace (no token ids, no text)")
    a.add_argument("trace", help="a canonical trace (e.g. from apcsim convert)")
    a.add_argument("--block-size", required=True, type=_positive, help="tokens per hashed block")
    a.add_argument("--salt", required=True, help="the secret key of the hashes (keep it private)")
    a.add_argument("--out", required=True, help="the hashed trace to write (JSONL)")
    a.add_argument("--skip-bad-lines", action="store_true", help="skip bad trace lines (counted) instead of stopping")
    a.set_defaults(func=_cmd_anonymize)

"""``apcsim`` command line.

``apcsim run CONFIG.yaml [--set key.path=value ...] [--out DIR] [--no-progress]`` replays one
experiment and writes its results folder. Errors in the config or the inputs are reported as one
clear message naming the file and key (or line), with exit code 2, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from sim.config import ConfigError, load_config
from sim.engine import ReplayError
from workloads.trace_format import TraceFormatError


def _cmd_run(args: argparse.Namespace) -> int:
    from sim.run import run_experiment

    cfg = load_config(args.config, args.set)
    result, folder = run_experiment(cfg, out=args.out, progress=False if args.no_progress else None)
    s = result.summary
    print(f"wrote {folder}/")
    keys = (
        "num_requests", "num_steps", "token_hit_rate", "request_hit_rate", "num_preemptions",
        "ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "tpot_p50_s", "throughput_output_tokens_per_s", "sim_time_s",
    )
    print(json.dumps({k: s[k] for k in keys}, indent=2))
    print(f"wall time {result.wall_time_s:.2f} s")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="apcsim", description="Simulate vLLM automatic prefix caching.")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="replay one experiment config and write results/<name>/")
    run.add_argument("config", help="experiment YAML file")
    run.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                     help="override a config key, e.g. --set engine.block_size=64 (repeatable)")
    run.add_argument("--out", default=None, help="results folder (default: <output_dir>/<name>)")
    run.add_argument("--no-progress", action="store_true", help="no progress bar")
    run.set_defaults(func=_cmd_run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except (ConfigError, TraceFormatError, ReplayError) as exc:
        print(f"apcsim: error: {exc}", file=sys.stderr)
        return 2
    except FileNotFoundError as exc:
        print(f"apcsim: error: {exc.filename}: no such file", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

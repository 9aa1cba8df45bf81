"""``apcsim`` command line (mirrors the ``vllm`` CLI's subcommand dispatch): parse, call one
experiment function, print (no simulation here).

``apcsim run CONFIG.yaml [--set key.path=value ...] [--out DIR] [--no-progress] [--json] [--no-bounds]
[--csv] [--backend sim|torch] [--device cpu|cuda]`` replays one experiment, writes its results
folder (replaced whole, ``sim.experiment.results_folder``; Ctrl-C prints what it holds, exit code
130) and prints the human summary of ``sim.cli.summary`` (``--json``: the headline metrics as JSON);
``--backend torch`` runs every step as a real forward pass (``gpu_backend``, reached through the
backend registry ``sim.experiment.backend`` and imported only then).
``apcsim sweep SWEEP.yaml`` runs a sweep and ``apcsim plot SWEEP_DIR`` plots one (``sim.cli.sweep``).
``apcsim size CONFIG --slo ttft_p99=2s`` finds the smallest replica count per router meeting the SLO
(``sim.cli.size``).
``apcsim workloads stats CONFIG [--block-size N,...]`` prints the shape and infinite-cache hit bound
of a config's workload (``sim.cli.workloads``).
``apcsim sidechannel STUDY.yaml`` runs a timing side-channel study and prints its per-policy table
(``sim.cli.sidechannel``).
``apcsim convert LOG --format openai --tokenizer MODEL_DIR --out T.jsonl`` turns your own traffic into a
trace and ``apcsim anonymize T.jsonl --block-size B --salt S --out H.jsonl`` hashes it for sharing
(``sim.cli.convert``).
``apcsim calibrate ...`` fits the latency model on the torch backend (``gpu_backend.calibration.calibrate``) and
``apcsim validate CONFIG`` compares simulated and real per-request latency (``gpu_backend.validation.validate``);
registered by ``sim.cli.calibrate``; torch and ``gpu_backend`` are imported only when they run.

Invariants: every error the user can fix is an :class:`~sim.core.errors.ApcsimError` (config,
workload, trace line, replay), caught here once and printed as one line naming the file and key
(or line), exit code 2, never a traceback; so are argparse's errors (``sim.cli.arguments.Parser``)
and the OS errors of a path a command opens. ``--json`` puts the JSON document alone on stdout
(everything else on stderr). A closed stdout (``| head -1``) ends the command quietly, exit code
141 (128 + SIGPIPE, what a shell reports for git). Imports neither torch nor gpu_backend.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from sim.cli.arguments import Parser, blame_overrides, json_number, os_error_line, quiet_broken_pipe
from sim.core.errors import ApcsimError
from sim.experiment.backend import EXECUTORS, executor_factory
from sim.experiment.config import ConfigError, load_config

if TYPE_CHECKING:  # the replay (simpy) is imported only when a command runs
    from sim.replay.engine import ReplayResult


def _load_timeline(folder: Path, result: ReplayResult, name: str, token_budget: int) -> None:
    """A fleet's load per replica over time (token budget and KV pool used), written into its results
    folder with the tables."""
    from sim.analysis.cluster_figures import replica_load_timeline
    from sim.analysis.figure_style import save_figure

    save_figure(replica_load_timeline(result.steps, f"{name}: load per replica", token_budget), folder,
                "load_timeline")


def _cmd_run(args: argparse.Namespace) -> int:
    from sim.experiment.run import run_experiment

    overrides = list(args.set)
    if args.device is not None:
        if args.backend != "torch":
            raise ConfigError("--device applies to --backend torch only")
        overrides.append(f"backend.device={args.device}")
    if args.csv:
        overrides.append("replay.tables=[parquet, csv]")
    cfg = load_config(args.config, overrides)
    if cfg.sidechannel is not None:
        raise ConfigError(f"{args.config}: sidechannel: a side-channel experiment runs with apcsim sidechannel")
    factory = executor_factory(args.backend)  # torch is imported only here, and only for the torch backend
    result, folder = run_experiment(
        cfg, out=args.out, progress=False if args.no_progress else None, executor_factory=factory,
        bounds=not args.no_bounds,
        extras=((lambda d, r: _load_timeline(d, r, cfg.name, cfg.engine.max_num_batched_tokens))
                if cfg.cluster is not None else None),
    )
    s = result.summary
    if args.json:  # stdout is the JSON document and nothing else; the rest goes to stderr
        print(f"wrote {folder}/", file=sys.stderr)
        keys = (
            "num_requests", "num_steps", "token_hit_rate", "request_hit_rate", "num_preemptions",
            "ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "tpot_p50_s", "throughput_output_tokens_per_s", "sim_time_s",
        )
        print(json.dumps({k: json_number(s[k]) for k in keys}, indent=2, allow_nan=False))
    else:
        from sim.cli.summary import render

        meta = json.loads((folder / "meta.json").read_text())
        print(render(s, name=cfg.name, folder=str(folder), wall_time_s=result.wall_time_s,
                     bounds_wall_time_s=meta.get("bounds_wall_time_s")))
    from sim.cli.summary import render_routers

    routers = [] if args.json else render_routers(s)
    if routers:
        print("\n".join(["", *routers]))
    if args.backend != "sim":
        info = json.loads((folder / "meta.json").read_text()).get("executor", {})
        shown = ("device", "device_name", "model_shape", "dtype", "attention", "timing", "step_times")
        print(f"{args.backend} backend: " + json.dumps({k: info.get(k) for k in shown}, indent=2),
              file=sys.stderr if args.json else sys.stdout)
    if args.json:
        print(f"wall time {result.wall_time_s:.2f} s", file=sys.stderr)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="apcsim", description="Simulate vLLM automatic prefix caching.")
    from sim.cli.version import VersionAction

    parser.add_argument("--version", action=VersionAction,
                        help="print apcsim's version, the vLLM version it mirrors and whether the compiled modules "
                             "are in use")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="replay one experiment config and write results/<name>/")
    run.add_argument("config", help="experiment YAML file")
    run.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                     help="override a config key, e.g. --set engine.block_size=64 (repeatable)")
    run.add_argument("--out", default=None, help="results folder (default: <output_dir>/<name>)")
    run.add_argument("--no-progress", action="store_true", help="no progress bar")
    run.add_argument("--json", action="store_true",
                     help="print the headline metrics as JSON (the output of earlier releases) instead of the table")
    run.add_argument("--no-bounds", action="store_true",
                     help="skip the offline references (infinite cache, Belady, sequential LRU) and the diagnosis "
                          "they feed; saves a pass over the workload")
    run.add_argument("--csv", action="store_true", help="write requests.csv and steps.csv beside the parquet tables")
    run.add_argument("--backend", choices=tuple(EXECUTORS), default="sim",
                     help="sim: step times from the latency model (default); torch: real forward passes "
                          "(gpu_backend, config section 'backend:'), measured step times")
    run.add_argument("--device", choices=("cpu", "cuda"), default=None,
                     help="device of the torch backend (overrides backend.device)")
    run.set_defaults(func=_cmd_run)
    from sim.cli.sweep import add_sweep_parsers

    add_sweep_parsers(sub)  # apcsim sweep SWEEP.yaml / apcsim plot SWEEP_DIR
    from sim.cli.size import add_size_parser

    add_size_parser(sub)  # apcsim size CONFIG --slo ttft_p99=2s
    from sim.cli.workloads import add_workloads_parser

    add_workloads_parser(sub)  # apcsim workloads stats CONFIG
    from sim.cli.calibrate import add_calibration_commands

    add_calibration_commands(sub)  # apcsim calibrate ... / apcsim validate CONFIG (gpu_backend, when run)
    from sim.cli.explain import add_explain_parser

    add_explain_parser(sub)  # apcsim explain RUN_DIR --request ID
    from sim.cli.sidechannel import add_sidechannel_parser

    add_sidechannel_parser(sub)  # apcsim sidechannel STUDY.yaml
    from sim.cli.convert import add_convert_parsers

    add_convert_parsers(sub)  # apcsim convert INPUT --format F ... / apcsim anonymize TRACE --block-size B ...
    from sim.cli.config_cmd import add_config_parser

    add_config_parser(sub)  # apcsim config schema | show CONFIG | reference
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:  # --help (0), or argparse's one error line (sim.cli.arguments.Parser, 2)
        return exc.code if isinstance(exc.code, int) else 2
    try:
        return int(args.func(args))
    except ApcsimError as exc:  # a value from --set is named as such, even when found after loading
        print(f"apcsim: error: {blame_overrides(str(exc), args)}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # the reader went away (apcsim run ... | head -1): stop quietly, as git does
        return quiet_broken_pipe()
    except OSError as exc:  # a path the command itself opens: missing, a folder, no permission
        print(f"apcsim: error: {os_error_line(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:  # RunInterrupted says what the results folder holds
        print(f"apcsim: {str(exc) or 'interrupted'}", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

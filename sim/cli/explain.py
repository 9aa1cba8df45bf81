"""``apcsim explain RUN_DIR --request ID [--blocks runs|all] [--json]`` and ``apcsim explain RUN_DIR
--top N [--json]`` (mirrors nothing in vLLM): why a request's prompt blocks hit or missed, from a run
recorded with ``replay.attribution: full`` -- consecutive blocks with the same cause on one line,
``--blocks all`` one line per block --, or the N requests that missed the most prompt tokens with
their main cause (``replay.attribution: summary`` is enough). On a cluster run ``--router NAME`` reads
the replay of a ``cluster.compare`` router instead of the run's own. Argument parsing and printing; the
content is :mod:`sim.analysis.explain`. Imports neither simpy nor torch.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def _cmd_explain(args: argparse.Namespace) -> int:
    from sim.analysis.explain import ExplainError, explain, render, render_top, top_requests
    from sim.experiment.results_access import reading_results
    from sim.experiment.results_folder import require_complete

    if (args.request is None) == (args.top is None):
        raise ExplainError("apcsim explain: give --request ID or --top N")
    require_complete(args.run_dir)  # a missing folder, or one an interrupted run left: refused first
    if args.top is not None:
        if args.top < 1:
            raise ExplainError(f"--top must be >= 1, got {args.top}")
        with reading_results(args.run_dir):
            t = top_requests(Path(args.run_dir), args.top, args.router)
        print(json.dumps(t, indent=2) if args.json else render_top(t))
        return 0
    with reading_results(args.run_dir):  # a damaged or foreign table: one line, not a traceback
        e = explain(Path(args.run_dir), args.request, args.router)
    print(json.dumps(e, indent=2) if args.json else render(e, all_blocks=args.blocks == "all"))
    return 0


def add_explain_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``apcsim explain`` on the CLI's sub-parsers."""
    ex = sub.add_parser("explain", help="why a request's prompt blocks hit or missed (needs replay.attribution: full)")
    ex.add_argument("run_dir", type=Path, help="results folder of apcsim run")
    ex.add_argument("--request", default=None, metavar="ID", help="request id")
    ex.add_argument("--blocks", choices=("runs", "all"), default="runs",
                    help="runs: consecutive blocks with the same cause on one line (default); all: one line per block")
    ex.add_argument("--top", type=int, default=None, metavar="N",
                    help="instead of one request: the N requests that missed the most prompt tokens, "
                         "with their main cause")
    ex.add_argument("--router", default=None, metavar="NAME",
                    help="a cluster run: the replay of this router of cluster.compare (default: the run's own)")
    ex.add_argument("--json", action="store_true", help="print JSON")
    ex.set_defaults(func=_cmd_explain)

"""``apcsim explain RUN_DIR --request ID [--json]`` (mirrors nothing in vLLM): why a request's
prompt blocks hit or missed, from a run recorded with ``replay.attribution: full`` (argument
parsing and printing; the content is :mod:`sim.analysis.explain`). Imports neither simpy nor torch.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def _cmd_explain(args: argparse.Namespace) -> int:
    from sim.analysis.explain import explain, render

    e = explain(Path(args.run_dir), args.request)
    print(json.dumps(e, indent=2) if args.json else render(e))
    return 0


def add_explain_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``apcsim explain`` on the CLI's sub-parsers."""
    ex = sub.add_parser("explain", help="why a request's prompt blocks hit or missed (needs replay.attribution: full)")
    ex.add_argument("run_dir", type=Path, help="results folder of apcsim run")
    ex.add_argument("--request", required=True, metavar="ID", help="request id")
    ex.add_argument("--json", action="store_true", help="print JSON")
    ex.set_defaults(func=_cmd_explain)

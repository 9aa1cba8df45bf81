"""``apcsim workloads stats CONFIG [--set k=v] [--block-size N[,N...]] [--json]`` (mirrors nothing
in vLLM): the shape of a
config's workload without replaying it (argument parsing and printing; the statistics are
``sim.experiment.workload.workload_stats``, their lines ``workloads.stats.format_stats``).

The bound is given at the engine's scheduler block size (``sim.experiment.engine_description``)
unless ``--block-size`` lists others. Invariants: nothing is replayed. Imports neither simpy nor
torch.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from sim.cli.arguments import int_list


def _cmd_stats(args: argparse.Namespace) -> int:
    from sim.experiment.config import load_config
    from sim.experiment.workload import workload_stats
    from workloads.stats import format_stats

    cfg = load_config(args.config, args.set)
    sizes = [n for item in args.block_size for n in item] or None  # parsed and checked by int_list
    s = workload_stats(cfg, sizes)
    print(json.dumps(s, indent=2, default=str) if args.json else format_stats(s))
    return 0


def add_workloads_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``apcsim workloads stats`` on the CLI's sub-parsers."""
    wl = sub.add_parser("workloads", help="inspect workloads")
    wsub = wl.add_subparsers(dest="workloads_command", required=True)
    st = wsub.add_parser("stats", help="print a config's workload shape and infinite-cache hit bound")
    st.add_argument("config", type=Path, help="experiment YAML file")
    st.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config key")
    st.add_argument("--block-size", action="append", default=[], metavar="N[,N...]", type=int_list(1),
                    help="block size(s) for the bound (default: the engine's scheduler block size); "
                         "repeatable or comma-separated")
    st.add_argument("--json", action="store_true", help="print JSON")
    st.set_defaults(func=_cmd_stats)

"""``apcsim config schema | show CONFIG [--set k=v] | reference`` (mirrors vLLM's generated
engine-argument docs and its start-up log of non-default arguments): the experiment config as a
JSON Schema for editors, one config fully resolved with each value's source, and the docs' config
reference page (argument parsing and printing; the content is ``sim.experiment.config_schema``
and ``sim.experiment.config_show``). Imports neither simpy nor torch.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def _cmd_schema(args: argparse.Namespace) -> int:
    from sim.experiment.config_schema import config_json_schema

    print(json.dumps(config_json_schema(), indent=2))
    return 0


def _cmd_show(args: argparse.Namespace) -> int:
    from sim.experiment.config_show import render_values, resolved_values

    print(render_values(resolved_values(args.config, args.set), str(args.config)))
    return 0


def _cmd_reference(args: argparse.Namespace) -> int:
    from sim.experiment.config_schema import render_reference

    print(render_reference(), end="")
    return 0


def add_config_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``apcsim config schema|show|reference`` on the CLI's sub-parsers."""
    cfg = sub.add_parser("config", help="the config's JSON Schema, a resolved config, the reference page")
    csub = cfg.add_subparsers(dest="config_command", required=True)
    schema = csub.add_parser("schema", help="print the experiment config's JSON Schema (for YAML editors)")
    schema.set_defaults(func=_cmd_schema)
    show = csub.add_parser("show", help="print a config fully resolved, with each value's source "
                                        "(default, file, --set or derived)")
    show.add_argument("config", type=Path, help="experiment YAML file")
    show.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config key")
    show.set_defaults(func=_cmd_show)
    ref = csub.add_parser("reference", help="print docs/config_reference.md (generated from the schema)")
    ref.set_defaults(func=_cmd_reference)

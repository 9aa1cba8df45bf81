"""``apcsim size CONFIG --slo ttft_p99=2s [--routers a,b] [--max-replicas N] [--set k=v] [--out DIR]``:
the smallest replica count per router meeting the SLO (``sim.experiment.sizing``; several SLOs
joined by commas, ``--slo ttft_p90=2s,tpot_p90=50ms``, must all hold), printed as a table and
written with its config and provenance to ``<out>/sizing.json`` (default
``<output_dir>/<name>/sizing/``). A config with ``cluster.disaggregation`` is sized per pool: the
prefill and decode replica counts with the fewest replicas in all (``sim.experiment.sizing_pd``;
``--max-replicas`` caps each pool).

Everything is checked before the first replay: the numbers (``--max-replicas`` from 1 to
:data:`MAX_REPLICAS`), one ``--slo``, each of ``--routers`` (named in its error), and ``--out``
(created and writable, ``sim.experiment.results_folder.writable_folder``). ``sizing.json`` records
the fingerprint of the input files (``sim.experiment.input_files``).

Mirrors nothing in vLLM. Invariants: parse, call the sizing search, print (CLI stays thin);
imports neither simpy nor torch at import time.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from sim.cli.arguments import int_at_least

MAX_REPLICAS = 4096
"""The largest --max-replicas (a fleet larger than this is a different question than sizing)."""


def _cmd_size(args: argparse.Namespace) -> int:
    from sim.experiment.config import ConfigError, config_to_dict, load_config
    from sim.experiment.input_files import fingerprint, input_files
    from sim.experiment.results import run_metadata, write_json
    from sim.experiment.results_access import writable_folder
    from sim.experiment.run import replay_experiment
    from sim.experiment.sizing import check_routers, parse_slos, size_router
    from sim.experiment.sizing_pd import PDSizing, size_pools

    cfg = load_config(args.config, list(args.set))
    if len(args.slo) > 1:  # one SLO per sizing: a second --slo is refused, not silently kept instead
        raise ConfigError(f"--slo given {len(args.slo)} times ({', '.join(args.slo)}); give every SLO in one "
                          "--slo, joined by commas (ttft_p90=2s,tpot_p90=50ms)")
    slos = parse_slos(args.slo[0])
    pools = cfg.cluster is not None and cfg.cluster.disaggregation is not None
    routers = [r for r in args.routers.split(",") if r] if args.routers else [
        cfg.cluster.router.kind if cfg.cluster is not None else "round_robin"]
    check_routers(cfg, routers)  # before the first replay, naming --routers
    # before the first replay, as apcsim run does: an --out that cannot hold sizing.json fails now
    out = writable_folder(Path(args.out) if args.out else cfg.results_dir() / "sizing", ("sizing.json",))
    inputs = fingerprint(input_files(cfg))

    def replay(c):  # type: ignore[no-untyped-def]
        result, _ = replay_experiment(c, progress=False)
        return result.summary

    def show(label: str, values: dict[str, float], met: bool) -> None:
        shown = ", ".join(f"{k} = {v:.3f} s" for k, v in values.items())
        print(f"  {label} -> {shown} ({'meets' if met else 'misses'} {goal})", flush=True)

    goal = " and ".join(f"{s.metric} <= {s.limit_s:g} s" for s in slos)
    sized = size_pools if pools else size_router
    results = [sized(cfg, r, slos, max_replicas=args.max_replicas, replay=replay, on_probe=show) for r in routers]
    print(f"\nsmallest {'prefill + decode' if pools else 'replica'} count with {goal}:")
    rows = []
    for s in results:
        row = {"router": s.router, "replicas": s.replicas, "probes": s.probes}
        count = str(s.replicas)
        if isinstance(s, PDSizing):
            row.update(prefill=s.prefill, decode=s.decode)
            count = f"{s.prefill} + {s.decode}"
        if s.replicas is None:
            count = f"> {args.max_replicas}{' per pool' if pools else ''}"
        print(f"  {s.router:<20} {count}  ({len(s.probes)} replays)")
        rows.append(row)
    first = {"metric": slos[0].metric, "limit_s": slos[0].limit_s}  # (the one-SLO form sizing.json had)
    write_json(out / "sizing.json", {
        "slo": first, "slos": [{"metric": s.metric, "limit_s": s.limit_s} for s in slos],
        "max_replicas": args.max_replicas, "routers": rows,
        "config": config_to_dict(cfg), "inputs": inputs, "meta": run_metadata(0.0),
    })
    print(f"wrote {out / 'sizing.json'}")
    return 0


def add_size_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("size", help="smallest replica count per router meeting latency SLOs (bisection; per pool "
                       "for a disaggregated fleet)")
    p.add_argument("config", help="experiment YAML file (its cluster section, if any, is the starting point)")
    p.add_argument("--slo", required=True, action="append",
                   help="e.g. ttft_p99=2s, ttft_p50<=500ms, e2e_p90=30s; several joined by commas, all to be met: "
                        "ttft_p90=2s,tpot_p90=50ms")
    p.add_argument("--routers", default=None,
                   help="comma-separated router kinds (llm_d:approximate for a prefix mode); default: the config's")
    p.add_argument("--max-replicas", type=int_at_least(1, maximum=MAX_REPLICAS), default=64,
                   help="give up above this count (default 64)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config key")
    p.add_argument("--out", default=None, help="folder for sizing.json (default <output_dir>/<name>/sizing)")
    p.set_defaults(func=_cmd_size)

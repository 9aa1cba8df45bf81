"""``apcsim sweep`` and ``apcsim plot`` (mirror nothing in vLLM; argument parsing, the work is in
``sim.experiment.sweep`` and ``sim.analysis.plots``).

``apcsim sweep SWEEP.yaml [--set key.path=value ...] [--workers N] [--ray] [--ray-address ADDR]
[--no-resume] [--no-plots] [--output-dir DIR] [--no-progress] [--force]`` runs every point (skipping
finished ones), writes ``<output_dir>/<name>/table.{parquet,csv}`` and the plots and prints the
points' table (``sim.cli.sweep_table``); exit code 1 when a point failed (the others still ran), 2
for a config problem -- among them a folder holding committed results without ``--force``
(``sim.experiment.tracked``).

``apcsim plot SWEEP_DIR`` (re)draws the plots of a sweep folder from its table.

Invariants: the sweep itself never plots; this command draws the plots once the table is
written. Imports neither simpy nor torch (matplotlib only when plotting).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from sim.cli.arguments import announce_points, int_at_least


def _cmd_sweep(args: argparse.Namespace) -> int:
    from sim.experiment.sweep import run_sweep
    from sim.experiment.sweep_config import load_sweep
    from sim.experiment.tracked import refuse_tracked

    sweep = load_sweep(args.sweep, args.output_dir, args.set)
    refuse_tracked(Path(sweep.folder()), args.force, "sweep")  # committed reference results stay as they are
    print(announce_points("sweep", sweep.name, sweep.points, sweep.folder(), args.yes), flush=True)
    report = run_sweep(
        sweep,
        workers=args.workers,
        ray=args.ray or args.ray_address is not None,
        ray_address=args.ray_address,
        resume=not args.no_resume,
        progress=False if args.no_progress else None,
    )
    stale = f" ({report.stale} of them again: their input files changed)" if report.stale else ""
    print(f"ran {report.ran}{stale}, skipped {report.skipped} finished earlier, {len(report.errors)} failed; "
          f"{report.wall_time_s:.1f} s")
    for point, msg in report.errors:
        print(f"  point {point}: {msg}")
    from sim.cli.sweep_table import render_sweep_table

    print(render_sweep_table(report.folder))
    print(f"table: {report.folder / 'table.parquet'} (and .csv)")
    if not args.no_plots:
        from sim.analysis.plots import plot_sweep

        plots = plot_sweep(report.folder)
        if plots:
            print(f"plots: {len(plots)} files in {report.folder}/")
    return 1 if report.errors else 0


def _cmd_plot(args: argparse.Namespace) -> int:
    from sim.analysis.plots import plot_sweep
    from sim.experiment.results_access import reading_results

    with reading_results(args.sweep_dir):  # a damaged or foreign table.parquet: one line, not a traceback
        paths = plot_sweep(Path(args.sweep_dir))
    for p in paths:
        print(p)
    return 0


def add_sweep_parsers(sub: argparse._SubParsersAction) -> None:
    sw = sub.add_parser("sweep", help="run a sweep file (grid/zip axes over config keys) and collect one table")
    sw.add_argument("sweep", help="sweep YAML file (see sim/experiment/sweep_config.py and configs/sweeps/)")
    sw.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="override a key of the base experiment, e.g. --set workload.limit=500 (repeatable)")
    sw.add_argument("--workers", type=int_at_least(1), default=None,
                    help="local worker processes (default: all cores)")
    sw.add_argument("--ray", action="store_true", help="run the points as Ray tasks (a local Ray instance)")
    sw.add_argument("--ray-address", default=None, metavar="ADDR",
                    help="run on the Ray cluster at ADDR (e.g. ray://head:10001 or auto); implies --ray")
    sw.add_argument("--no-resume", action="store_true", help="rerun every point, even finished ones")
    sw.add_argument("--no-plots", action="store_true", help="write the table only")
    sw.add_argument("--no-progress", action="store_true", help="no progress bar")
    sw.add_argument("--output-dir", default=None, help="parent of the sweep folder (default: the file's output_dir)")
    sw.add_argument("--yes", action="store_true",
                    help="run even more than 1,000 points (without it such a sweep is refused before it starts)")
    sw.add_argument("--force", action="store_true",
                    help="write into a folder holding committed (reference) results; refused without it")
    sw.set_defaults(func=_cmd_sweep)
    pl = sub.add_parser("plot", help="draw a sweep folder's plots (PNG and SVG) from its table")
    pl.add_argument("sweep_dir", help="a sweep folder (holds table.parquet and sweep.json)")
    pl.set_defaults(func=_cmd_plot)

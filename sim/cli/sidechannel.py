"""``apcsim sidechannel``: run a timing side-channel study and print its per-policy table (mirrors
nothing in vLLM; argument parsing -- the work is in ``sim.experiment.sidechannel_study`` and
``sim.analysis.sidechannel_*``).

``apcsim sidechannel STUDY.yaml [--set key.path=value ...] [--workers N] [--ray] [--ray-address
ADDR] [--no-resume] [--no-plots] [--output-dir DIR] [--no-progress] [--force]`` runs every point of a
study (a sweep file whose points have a ``sidechannel:`` section, or one such experiment file), writes
the sweep table, ``headline.md`` / ``headline.csv`` and the figures into the study folder and
prints the headline table; exit code 1 when a point failed, 2 for a config problem (a folder
holding committed results without ``--force`` among them: ``sim.experiment.tracked``).

Invariants: prints and plots only what the study's table holds. Imports neither simpy nor torch
(matplotlib only when plotting).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from sim.cli.arguments import announce_points, int_at_least


def _cmd_sidechannel(args: argparse.Namespace) -> int:
    from sim.experiment.sidechannel_study import load_study, run_study
    from sim.experiment.tracked import refuse_tracked

    study = load_study(args.study, args.output_dir, args.set)
    refuse_tracked(Path(study.folder()), args.force, "study")  # committed reference results stay as they are
    print(announce_points("sidechannel", study.name, study.points, study.folder(), args.yes), flush=True)
    report = run_study(study, workers=args.workers, ray=args.ray or args.ray_address is not None,
                       ray_address=args.ray_address, resume=not args.no_resume,
                       progress=False if args.no_progress else None)
    stale = f" ({report.stale} of them again: their input files changed)" if report.stale else ""
    print(f"ran {report.ran}{stale}, skipped {report.skipped} finished earlier, {len(report.errors)} failed; "
          f"{report.wall_time_s:.1f} s")
    for point, msg in report.errors:
        print(f"  point {point}: {msg}")
    if len(report.errors) == len(study.points):
        return 1
    from sim.analysis.sidechannel_table import write_tables

    tables = write_tables(report.folder)
    print(tables[0].read_text())
    print(f"tables: {', '.join(str(p) for p in tables)}")
    if not args.no_plots:
        from sim.analysis.sidechannel_figures import plot_sidechannel

        plots = plot_sidechannel(report.folder)
        print(f"plots: {len(plots)} files in {report.folder}/")
    return 1 if report.errors else 0


def add_sidechannel_parser(sub: argparse._SubParsersAction) -> None:
    sc = sub.add_parser("sidechannel", help="run a timing side-channel study (salt policy x load x block size x "
                                            "noise) and print the per-policy AUC table")
    sc.add_argument("study", help="a sweep or experiment YAML file with a sidechannel: section "
                                  "(see configs/sidechannel.yaml)")
    sc.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="override a key of the base experiment, e.g. --set sidechannel.presence.victim_requests=50")
    sc.add_argument("--workers", type=int_at_least(1), default=None,
                    help="local worker processes (default: all cores)")
    sc.add_argument("--ray", action="store_true", help="run the points as Ray tasks (a local Ray instance)")
    sc.add_argument("--ray-address", default=None, metavar="ADDR", help="run on the Ray cluster at ADDR; implies --ray")
    sc.add_argument("--no-resume", action="store_true", help="rerun every point, even finished ones")
    sc.add_argument("--no-plots", action="store_true", help="write the tables only")
    sc.add_argument("--no-progress", action="store_true", help="no progress bar")
    sc.add_argument("--output-dir", default=None, help="parent of the study folder (default: the file's output_dir)")
    sc.add_argument("--yes", action="store_true",
                    help="run even more than 1,000 points (without it such a sidechannel is refused before it starts)")
    sc.add_argument("--force", action="store_true",
                    help="write into a folder holding committed (reference) results; refused without it")
    sc.set_defaults(func=_cmd_sidechannel)

"""The local process pool of ``apcsim sweep``, surviving a worker that dies (mirrors nothing in
vLLM).

Points run in a ``ProcessPoolExecutor`` with at most ``workers`` points handed out at a time, so
that when a worker process dies (SIGKILL, the OOM killer, a crash in native code) the pool's
``BrokenProcessPool`` can be pinned on the points in flight at that moment. Those points are then
retried once each, alone in a fresh process (:func:`_run_isolated`), and a point whose process
dies again is recorded as failed (``status: error``, ``error: WorkerDied: ...`` with the exit
signal or code) like any failing point; the other points go on in a new pool, and the table is
written as usual. A point that raises is no worker death: it is recorded by the worker itself
(``sim.experiment.sweep_point.compute_point``).

Invariants: every task yields exactly one row through ``on_row``; a point is never run more than
twice because of worker deaths; workers drop the inherited sweep-lock descriptor and exit when the
driver goes away (``kill -9`` of the driver leaves no orphan). Imports neither torch nor simpy
(simpy only inside the workers).
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any

from sim.experiment.sweep_point import commit_point, error_result, run_and_commit

OnRow = Callable[[dict[str, Any]], None]


class WorkerDied(RuntimeError):
    """The process running a point died without a result."""


def watch_parent(close_fds: tuple[int, ...] = ()) -> None:
    """Worker initializer: drop the inherited sweep-lock descriptor (so that the lock dies with the
    driver), and exit when the parent (the driver) goes away, e.g. after ``kill -9``, instead of
    running on as an orphan."""
    for fd in close_fds:
        try:
            os.close(fd)
        except OSError:
            pass
    parent = os.getppid()

    def loop() -> None:
        while True:
            time.sleep(1.0)
            if os.getppid() != parent:
                os._exit(1)

    threading.Thread(target=loop, daemon=True).start()


def mp_context() -> Any:
    """``fork`` on Linux: workers start at once with everything imported, and their parent is this
    process, which the orphan watchdog relies on (it forks before any other thread exists: the
    pool starts its workers at the first submit, and the progress bar runs no monitor thread).
    Elsewhere the platform default."""
    if sys.platform.startswith("linux"):
        return multiprocessing.get_context("fork")
    return multiprocessing.get_context()  # pragma: no cover


def _exit_text(code: int | None) -> str:
    if code is None:
        return "no exit status"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def _isolated_main(task: dict[str, Any], points_dir: str, conn: Any, fds: tuple[int, ...]) -> None:
    watch_parent(fds)
    conn.send(run_and_commit(task, points_dir))
    conn.close()


def _run_isolated(task: dict[str, Any], points_dir: Path, fds: tuple[int, ...]) -> dict[str, Any]:
    """Retry one point alone in a fresh process; a second death is recorded as the point's error."""
    ctx = mp_context()
    recv, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_isolated_main, args=(task, str(points_dir), send, fds), daemon=True)
    proc.start()
    send.close()
    row: dict[str, Any] | None = None
    try:
        row = recv.recv()
    except EOFError:  # the process died before sending its row
        pass
    finally:
        recv.close()
        proc.join()
    if row is not None:
        return row
    exc = WorkerDied(f"the worker process died twice running this point (last time: {_exit_text(proc.exitcode)})")
    row, files = error_result(task["key"], exc, worker=False)
    commit_point(points_dir, task["key"], files, replace=bool(task.get("replace")))
    return row


def _pool_round(tasks: list[dict[str, Any]], points_dir: Path, workers: int, on_row: OnRow,
                fds: tuple[int, ...]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Run ``tasks`` in one pool until done or broken; returns (points in flight when the pool broke,
    points not handed out yet)."""
    queue = list(reversed(tasks))
    with ProcessPoolExecutor(max_workers=workers, mp_context=mp_context(), initializer=watch_parent,
                             initargs=(fds,)) as pool:
        inflight: dict[Future[dict[str, Any]], dict[str, Any]] = {}
        try:
            while queue or inflight:
                while queue and len(inflight) < workers:
                    t = queue.pop()
                    inflight[pool.submit(run_and_commit, t, str(points_dir))] = t
                done, _ = wait(inflight, return_when=FIRST_COMPLETED)
                broken = False
                for f in done:
                    try:
                        row = f.result()
                    except BrokenProcessPool:
                        broken = True
                        continue
                    on_row(row)
                    del inflight[f]
                if broken:  # the futures still in flight failed with it: those points are suspects
                    suspects = []
                    for f, t in inflight.items():
                        if f.done() and f.exception() is None:  # finished just before the break
                            on_row(f.result())
                        else:
                            suspects.append(t)
                    return suspects, queue[::-1]
        except BaseException:
            for f in inflight:
                f.cancel()
            raise
    return [], []


def run_local(tasks: list[dict[str, Any]], points_dir: Path, workers: int, on_row: OnRow,
              lock_fd: int | None = None) -> None:
    """Run every task (see the module docstring); ``on_row`` gets each point's row."""
    if workers <= 1 or len(tasks) <= 1:
        for t in tasks:  # in this process: nothing to retry if it dies, the sweep dies with it
            on_row(run_and_commit(t, str(points_dir)))
        return
    fds = (lock_fd,) if lock_fd is not None else ()
    todo = list(tasks)
    while todo:
        suspects, todo = _pool_round(todo, points_dir, workers, on_row, fds)
        for t in suspects:
            on_row(_run_isolated(t, points_dir, fds))

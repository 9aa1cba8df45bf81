"""Fault tests of ``apcsim run``'s results folder: SIGKILL, SIGINT and a full disk at
every file-system operation of a run, in a fresh folder and over an old one. Every time the folder
is the old complete results or the new complete results (or absent when there were none), an
interrupted run says which, and the next run cleans up what a killed one left.

The faults land at exact points: a forked child runs ``run_experiment`` with an audit hook
(``sys.addaudithook``) that counts the file-system events (open, rename, remove, mkdir, listdir,
flock, ...) and, at event ``k``, sends itself SIGKILL or SIGINT or fails the operation with ENOSPC.
Beside them, real ``python -m sim.cli run`` processes are killed at random moments, and -- where
the machine lets an unprivileged user namespace mount one -- a run fills a tiny tmpfs.
"""

from __future__ import annotations

import errno
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from sim.experiment.config import load_config
from sim.experiment.results_folder import ResultsError, RunInterrupted, recover
from sim.experiment.run import run_experiment

ROOT = Path(__file__).resolve().parents[1]
FS_EVENTS = frozenset({"open", "os.listdir", "os.scandir", "os.rename", "os.remove", "os.rmdir", "os.mkdir",
                       "shutil.rmtree", "fcntl.flock", "pathlib.Path.glob", "ctypes.dlsym"})
BASE = {
    "name": "ft",
    "engine": {"block_size": 16, "num_gpu_blocks": 400, "max_model_len": 4096},
    "latency": {"kind": "fixed", "step_time_s": 0.02},
    "workload": {"kind": "synthetic_shared_prefix", "num_requests": 12, "prefix_tokens": 64,
                 "suffix_tokens": 16, "output_tokens": 3, "rate": 50.0},
}
OLD_OVERRIDES = ["workload.num_requests=5", "replay.record_events=true", "replay.tables=[parquet, csv]"]


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


class Fixture:
    def __init__(self, root: Path) -> None:
        self.root = root
        cfg_path = root / "exp.yaml"
        cfg_path.write_text(yaml.safe_dump(BASE))
        self.old_cfg = load_config(cfg_path, OLD_OVERRIDES)
        self.new_cfg = load_config(cfg_path)
        run_experiment(self.old_cfg, out=root / "ref_old" / "ft", progress=False)
        run_experiment(self.new_cfg, out=root / "ref_new" / "ft", progress=False)
        self.old = _snapshot(root / "ref_old" / "ft")
        self.new = _snapshot(root / "ref_new" / "ft")

    def state(self, final: Path) -> str:
        """absent / old / new, or what is wrong."""
        if not final.exists():
            return "absent"
        got = _snapshot(final)
        if got == self.old:
            return "old"
        if set(got) == set(self.new) and all(got[n] == self.new[n] for n in got if n != "meta.json"):
            return "new" if json.loads(got["meta.json"])["complete"] is True else "new without marker"
        return f"mixed: {sorted(got)}"


@pytest.fixture(scope="module")
def fx(tmp_path_factory) -> Fixture:
    return Fixture(tmp_path_factory.mktemp("faults"))


def _allocates(event: str, args: tuple) -> bool:
    """Could this operation need disk space (where a full disk fails)? Writes and new entries."""
    if event == "os.mkdir":
        return True
    if event != "open":
        return False
    mode, flags = args[1], args[2]
    if isinstance(mode, str):
        return any(c in mode for c in "wax+")
    return bool(flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT))


def _fault_child(fx: Fixture, final: Path, mode: str, k: int, report: Path) -> None:
    """In the forked child: run with the fault at file-system event ``k``; report the outcome."""
    count = 0
    armed = True
    # the child inherits the test process's SIGINT disposition and signal mask, which an earlier test
    # or library may have changed: give it those of a fresh ``apcsim run`` process
    blocked = sorted(signal.pthread_sigmask(signal.SIG_BLOCK, []))
    inherited = f"handler {signal.getsignal(signal.SIGINT)!r}, blocked {blocked}"
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})

    def hook(event: str, args: tuple) -> None:
        nonlocal count, armed
        if not armed or event not in FS_EVENTS or (mode.endswith("enospc") and not _allocates(event, args)):
            return
        count += 1
        if count != k or mode.startswith("count"):
            return
        armed = False
        if mode == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        elif mode == "int":
            os.kill(os.getpid(), signal.SIGINT)  # KeyboardInterrupt at the next bytecode: inside this hook
        else:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    import pandas as pd

    def audited(write):  # pyarrow and pandas write natively, unseen by audit hooks: make them an event
        def wrapper(df, path, *a, **kw):
            Path(path).write_bytes(b"PAR1 half a table")  # what a full disk leaves: a partial file
            sys.audit("open", str(path), "wb", 0)
            return write(df, path, *a, **kw)
        return wrapper

    def audited_arrow(write):  # the same for a Table written by pyarrow into the file results.py opened
        def wrapper(table, fh, *a, **kw):
            fh.write(b"PAR1 half a table")
            fh.flush()
            sys.audit("open", fh.name, "wb", 0)
            fh.seek(0)
            fh.truncate()
            return write(table, fh, *a, **kw)
        return wrapper

    import pyarrow.parquet as pq

    pd.DataFrame.to_parquet = audited(pd.DataFrame.to_parquet)
    pd.DataFrame.to_csv = audited(pd.DataFrame.to_csv)
    pq.write_table = audited_arrow(pq.write_table)
    sys.addaudithook(hook)
    try:
        run_experiment(fx.new_cfg, out=final, progress=False)
        outcome = "ok"
    except (RunInterrupted, ResultsError) as exc:
        outcome = f"{type(exc).__name__}: {exc}"
    armed = False
    report.write_text(json.dumps({"outcome": outcome, "events": count, "inherited": inherited}))


def _run_with_fault(fx: Fixture, case: Path, mode: str, k: int) -> dict:
    report = case / "report.json"
    report.unlink(missing_ok=True)
    pid = os.fork()
    if pid == 0:  # pragma: no cover  (the child)
        code = 0
        try:
            _fault_child(fx, case / "out" / "ft", mode, k, report)
        except BaseException:  # not one of apcsim's own errors: the test fails with its traceback
            import traceback

            (case / "crash.txt").write_text(traceback.format_exc())
            code = 3
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    died = os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    if not died and os.waitstatus_to_exitcode(status) != 0:
        crash = case / "crash.txt"
        pytest.fail(f"{mode} at event {k}: child exit {status}\n{crash.read_text() if crash.exists() else ''}")
    return {"outcome": "killed", "events": None} if died else json.loads(report.read_text())


def _prepare(fx: Fixture, case: Path, over_old: bool) -> Path:
    shutil.rmtree(case, ignore_errors=True)
    (case / "out").mkdir(parents=True)
    final = case / "out" / "ft"
    if over_old:
        shutil.copytree(fx.root / "ref_old" / "ft", final)
    return final


def _num_events(fx: Fixture, case: Path, mode: str = "kill") -> int:
    """How many events the fault of ``mode`` can land on in one run over an old folder."""
    _prepare(fx, case, True)
    events = _run_with_fault(fx, case, "count-enospc" if mode == "enospc" else "count", 0)["events"]
    assert events > (8 if mode == "enospc" else 20)
    return events


def _expect_message(outcome: str, state: str, final: Path) -> None:
    phrases = {"old": f"{final} still holds the previous complete results",
               "new": f"{final} holds this run's complete results",
               "absent": f"nothing was written to {final}"}
    assert phrases[state] in outcome or "cannot write results here" in outcome, (state, outcome)


@pytest.mark.parametrize("over_old", [True, False], ids=["over_old", "fresh"])
@pytest.mark.parametrize("mode", ["kill", "int", "enospc"])
def test_fault_at_every_file_operation_leaves_old_or_new_complete(fx, tmp_path, mode, over_old):
    case = tmp_path / "case"
    n = _num_events(fx, case, mode)
    # SIGKILL and ENOSPC over an old folder: every event; SIGINT over an old folder every other
    # one, fresh folders every third (SIGINT shifted by one), so that the suite stays quick
    step = 1 if (mode, over_old) in (("kill", True), ("enospc", True)) else 2 if over_old else 3
    points = range(1 + (step > 1 and mode == "int"), n + 2, step)
    seen: set[str] = set()
    for k in points:
        final = _prepare(fx, case, over_old)
        res = _run_with_fault(fx, case, mode, k)
        state = fx.state(final)
        allowed = {"old", "new"} if over_old else {"absent", "new"}
        assert state in allowed, f"{mode} at event {k}/{n}: {state} ({res['outcome']}; {res.get('inherited')})"
        if mode != "kill" and res["outcome"] != "ok":
            _expect_message(res["outcome"], state, final)
        if mode == "enospc" and res["outcome"] != "ok":
            assert "No space left on device" in res["outcome"]
        seen.add(state)
        recover(final)  # what the next run does first, under the lock
        left = [p.name for p in final.parent.iterdir() if p.name.startswith((".tmp-", ".old-"))]
        assert not left, f"{mode} at event {k}: leftovers {left}"
        assert fx.state(final) == state
    # the faults did land on both sides of the swap
    assert "new" in seen and seen & {"old", "absent"}, (seen, res.get("inherited"))


def test_a_killed_run_leaves_the_lock_free_and_the_next_run_cleans_up(fx, tmp_path):
    case = tmp_path / "case"
    final = _prepare(fx, case, True)
    n = _num_events(fx, case)
    final = _prepare(fx, case, True)
    _run_with_fault(fx, case, "kill", n - 3)  # late: the temporary folder is full
    run_experiment(fx.new_cfg, out=final, progress=False)
    assert fx.state(final) == "new"
    assert sorted(p.name for p in final.parent.iterdir()) == [".ft.lock", "ft"]


def _cli(args: list[str]) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    # --no-bounds: the fixture's reference folders are written by run_experiment, without the bounds,
    # so that a run the signal reaches too late ends "new", byte for byte
    return subprocess.Popen([sys.executable, "-m", "sim.cli", "run", *args, "--no-bounds"], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_real_processes_killed_at_random_moments(fx, tmp_path):
    """``python -m sim.cli run`` over an old folder, SIGKILL / SIGINT at random times."""
    cfg = tmp_path / "exp.yaml"
    cfg.write_text(yaml.safe_dump(BASE))
    t0 = time.perf_counter()
    ref = _cli([str(cfg), "--no-progress", "--out", str(tmp_path / "timing" / "ft")])
    assert ref.wait(timeout=120) == 0
    duration = time.perf_counter() - t0
    rng = random.Random(16)
    for i, sig in enumerate([signal.SIGKILL, signal.SIGINT]):
        case = tmp_path / f"c{i}"
        final = _prepare(fx, case, True)
        proc = _cli([str(cfg), "--no-progress", "--out", str(final)])
        time.sleep(rng.uniform(0.5, 1.0) * duration)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=120)
        state = fx.state(final)
        assert state in ("old", "new"), (sig, state, err)
        if sig == signal.SIGINT and proc.returncode == 130:
            last = err.strip().splitlines()[-1]
            assert last.startswith("apcsim: interrupted"), err
            if str(final) in last:  # interrupted once the results folder was open: it says what it holds
                _expect_message(last, state, final)


def _can_mount_tmpfs() -> bool:
    if shutil.which("unshare") is None or not sys.platform.startswith("linux"):
        return False
    probe = subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "sh", "-c",
                            "d=$(mktemp -d) && mount -t tmpfs -o size=64k tmpfs $d && umount $d"],
                           capture_output=True, timeout=30)
    return probe.returncode == 0


_TMPFS_SCRIPT = """
import json, os, sys
from pathlib import Path
sys.path.insert(0, {root!r})
from sim.cli.main import main
mnt, cfg = Path(sys.argv[1]), sys.argv[2]
final = mnt / "ft"
assert main(["run", cfg, "--no-progress", "--out", str(final), "--set", "workload.num_requests=5"]) == 0
old = {{p.name: p.read_bytes() for p in final.iterdir()}}
code = main(["run", cfg, "--no-progress", "--csv", "--out", str(final), "--set", "workload.num_requests=400"])
now = {{p.name: p.read_bytes() for p in final.iterdir()}}
print(json.dumps({{"code": code, "same": now == old, "entries": sorted(os.listdir(mnt))}}))
"""


@pytest.mark.skipif(not _can_mount_tmpfs(), reason="no unprivileged tmpfs mount here (the injected ENOSPC runs)")
def test_a_full_tmpfs_leaves_the_old_results(tmp_path):
    cfg = tmp_path / "exp.yaml"
    cfg.write_text(yaml.safe_dump(BASE))
    script = tmp_path / "fill.py"
    script.write_text(_TMPFS_SCRIPT.format(root=str(ROOT)))
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    res = subprocess.run(
        ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c",
         f"mount -t tmpfs -o size=160k tmpfs {mnt} && {sys.executable} {script} {mnt} {cfg}"],
        capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out == {"code": 2, "same": True, "entries": [".ft.lock", "ft"]}, (out, res.stderr)
    line = res.stderr.strip().splitlines()[-1]
    assert line == (f"apcsim: error: {mnt}/ft: could not write the results (No space left on device); "
                    f"{mnt}/ft still holds the previous complete results"), res.stderr

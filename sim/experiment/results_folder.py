"""A run's results folder, replaced whole or not at all (mirrors nothing in vLLM).

``apcsim run`` never writes into ``results/<name>/`` itself. :class:`ResultsFolder` works beside
it, in the same parent folder (so every rename stays on one file system):

1. :meth:`~ResultsFolder.open` -- *before the replay*: refuses a target that is a file, or a
   folder holding anything but result files (it will be replaced whole) -- checked by name *and*
   kind: an entry named like a result file must be a regular file, not a folder, link or FIFO
   (a user's folder named ``summary.json`` is never deleted), and apcsim's own subfolders
   (:data:`OWN_SUBFOLDERS`: ``sizing/``) hold only their apcsim files (they are carried into the
   new results); creates the parent; takes
   the lock ``.<name>.lock`` (``flock``, non-blocking: a second run on the same target *refuses*
   with a message naming the lock, it does not wait); puts back a folder that an interrupted swap
   left aside and removes leftovers of killed runs; creates the private temporary folder
   ``.tmp-<name>-<random>/``. Every problem here is a :class:`ResultsError`, so an unwritable
   ``output_dir`` fails in a second, not after the replay.
2. the caller writes every file into :attr:`~ResultsFolder.tmp`, ``meta.json`` last with
   ``complete: true`` and this run's ``run_id`` (``sim.experiment.results``);
3. :meth:`~ResultsFolder.commit` swaps the temporary folder in: one ``renameat2(RENAME_EXCHANGE)``
   when the target exists (Linux; the old folder then sits at the temporary name and is deleted),
   one ``rename`` when it does not. Where the exchange is unavailable the old folder is first
   renamed to ``.old-<name>-<random>/``; a kill between the two renames leaves no target but that
   complete old folder, which the next ``open`` (or :func:`recover`) puts back.

Guarantee: whatever stops a run (an error, SIGINT, SIGKILL, a full disk), ``results/<name>/`` holds
the previous complete results or this run's complete results (or nothing, if there were none
before), never a mixture; an interrupted run says which (:class:`RunInterrupted`). Folders
without the marker -- written by an older apcsim, or copied half -- are refused by
:func:`require_complete`.

Invariants: the lock is held from ``open`` to ``close``; only names starting with ``.tmp-<name>-``
or ``.old-<name>-`` are ever deleted besides the replaced target itself. Imports neither simpy nor
torch.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import re
import shutil
import stat
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sim.core.errors import ApcsimError

RESULT_FILES = frozenset({
    "requests.parquet", "requests.csv", "steps.parquet", "steps.csv", "summary.json",
    "config.resolved.yaml", "meta.json", "kv_events.jsonl",
    "replicas.csv", "load_timeline.png", "load_timeline.svg",  # a cluster run (cluster_run, apcsim run)
    "blocks.parquet", "blocks.csv",  # replay.attribution: full (sim.experiment.results, for apcsim explain)
    "compared_requests.parquet", "compared_blocks.parquet",  # attribution + cluster.compare (cluster_run)
})
"""What a results folder may hold (apart from the hidden temporary files of older versions): a
folder with anything else is not replaced."""

_SUFFIX = 12  # hex digits of a temporary folder's random suffix
_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


class ResultsError(ApcsimError):
    """The results folder cannot be written, or a folder read back is not complete results."""


class RunInterrupted(KeyboardInterrupt):
    """A run stopped by SIGINT; ``str()`` says what the results folder holds now."""


def is_complete(folder: Path) -> bool:
    """True when ``folder/meta.json`` carries ``complete: true``."""
    return read_meta(folder).get("complete") is True


def read_meta(folder: Path) -> dict[str, Any]:
    """``folder/meta.json`` as a mapping ({} when absent or unreadable)."""
    try:
        data = json.loads((Path(folder) / "meta.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def require_complete(folder: str | Path) -> dict[str, Any]:
    """``folder``'s ``meta.json`` if it holds complete run results, else :class:`ResultsError`."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ResultsError(f"{folder}: no such results folder")
    meta = read_meta(folder)
    if meta.get("complete") is not True:
        raise ResultsError(
            f"{folder}: not a complete results folder (meta.json has no 'complete: true': the run was "
            f"interrupted, or an older apcsim wrote it); rerun apcsim run"
        )
    return meta


def require_complete_sweep(folder: str | Path) -> dict[str, Any]:
    """A sweep folder's ``sweep.json`` if its table is complete (``complete: true``, written by
    ``sim.experiment.sweep`` once the table is), else :class:`ResultsError`."""
    folder = Path(folder)
    try:
        manifest = json.loads((folder / "sweep.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        manifest = None
    if not isinstance(manifest, dict) or manifest.get("complete") is not True:
        raise ResultsError(
            f"{folder}: not a complete sweep folder (sweep.json has no 'complete: true': the sweep is running, "
            f"was interrupted, or an older apcsim wrote it); rerun apcsim sweep (finished points are kept)"
        )
    return manifest


def os_problem(exc: OSError) -> str:
    """The system's words for an OSError (``No space left on device``), also for pyarrow's, which
    carry the errno only in their text."""
    code = exc.errno
    if code is None:
        found = re.search(r"\[errno (\d+)\]", str(exc), re.IGNORECASE)
        code = int(found.group(1)) if found else None
    return os.strerror(code) if code else str(exc)


OWN_SUBFOLDERS = {"sizing": frozenset({"sizing.json"})}
"""apcsim's own subfolders of a run's results folder (``apcsim size``'s default ``--out``), with the
files they may hold: such a folder holding only those, as regular files, is kept -- copied into
the new results when a run replaces the folder; anything else under that name is refused."""


def _own_subfolder(p: Path) -> bool:
    """Whether ``p`` is one of :data:`OWN_SUBFOLDERS` holding only its apcsim files."""
    allowed = OWN_SUBFOLDERS.get(p.name)
    if allowed is None or p.is_symlink() or not p.is_dir():
        return False
    return all(f.name in allowed and not not_a_file(f) for f in p.iterdir())


def not_a_file(p: Path) -> str:
    """'' for a regular file (not a link), else what ``p`` is (``a folder``, ``a symbolic link``)."""
    mode = os.lstat(p).st_mode
    if stat.S_ISREG(mode):
        return ""
    return ("a folder" if stat.S_ISDIR(mode) else "a symbolic link" if stat.S_ISLNK(mode)
            else "a FIFO" if stat.S_ISFIFO(mode) else "not a regular file")


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths atomically (Linux ``renameat2``); False when the system cannot."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        return False
    rc = fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE)
    if rc == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(b))


def recover(final: Path) -> None:
    """Clean up after killed runs on ``final`` (call with its lock held): put back an old folder
    left aside by an interrupted fallback swap, delete temporary folders."""
    parent = final.parent
    if not parent.is_dir():
        return
    # exactly <prefix><name>-<12 hex>: never the leftovers of another folder whose name starts alike
    mine = re.compile(rf"\.(tmp|old)-{re.escape(final.name)}-[0-9a-f]{{{_SUFFIX}}}")
    ours = sorted(p for p in parent.iterdir() if mine.fullmatch(p.name))
    olds = [p for p in ours if p.name.startswith(".old-")]
    if olds and not final.exists() and is_complete(olds[0]):
        os.rename(olds[0], final)
        ours.remove(olds[0])
    for p in ours:
        shutil.rmtree(p, ignore_errors=True)


class ResultsFolder:
    """The atomic, locked writer of one results folder (see the module docstring)."""

    def __init__(self, final: str | Path, *, allowed: Callable[[str], bool] = RESULT_FILES.__contains__) -> None:
        """``allowed(name)``: whether an existing folder's file is one this writer's results hold
        (default: an ``apcsim run``'s, :data:`RESULT_FILES`); a folder with any other is not replaced."""
        self.final = Path(final).expanduser()
        self._allowed = allowed
        self.tmp: Path | None = None
        self._lock_fd: int | None = None
        self.run_id: str | None = None  # set by the writer: the run_id its meta.json carries

    # -- before the replay ------------------------------------------------------------------
    def open(self) -> ResultsFolder:
        """Check, lock, recover, create the temporary folder (see the module docstring)."""
        final, parent = self.final, self.final.parent
        if final.name in ("", ".", ".."):
            raise ResultsError(f"{final}: cannot be a results folder (name the folder itself)")
        try:
            parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ResultsError(f"{final}: cannot create the folder {parent}: {os_problem(exc)}") from None
        self._lock()
        try:
            recover(final)
            self._check_target()
            tmp = parent / f".tmp-{final.name}-{uuid.uuid4().hex[:_SUFFIX]}"
            tmp.mkdir()  # not mkdtemp: a results folder gets the umask's permissions, not 0700
            self.tmp = tmp
        except OSError as exc:
            self.close()
            raise ResultsError(f"{final}: cannot write results here: {os_problem(exc)}") from None
        except BaseException:
            self.close()
            raise
        return self

    def _lock(self) -> None:
        path = self.final.parent / f".{self.final.name}.lock"
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise ResultsError(f"{self.final}: cannot write results here: {os_problem(exc)} ({path})") from None
        try:
            import fcntl

            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except ImportError:  # pragma: no cover  (no fcntl: no locking)
            pass
        except BlockingIOError:  # EWOULDBLOCK: someone holds it
            os.close(fd)
            raise ResultsError(
                f"{self.final}: another apcsim run is writing these results (lock {path}); wait for it "
                f"to finish or pick another --out"
            ) from None
        except OSError as exc:
            os.close(fd)
            raise ResultsError(f"{self.final}: cannot write results here: cannot lock {path}: "
                               f"{os_problem(exc)}") from None
        except BaseException:
            os.close(fd)
            raise
        self._lock_fd = fd

    def _check_target(self) -> None:
        final = self.final
        if final.is_symlink():
            raise ResultsError(f"{final}: is a symbolic link; give the folder it points to, or another --out")
        if final.exists() and not final.is_dir():
            raise ResultsError(f"{final}: exists and is not a folder; remove it or pick another --out")
        if final.is_dir():
            entries = sorted(p for p in final.iterdir() if not _own_subfolder(p))  # apcsim size's: kept
            foreign = [p.name for p in entries
                       if not self._allowed(p.name) and not (p.name.startswith(".") and p.name.endswith(".tmp"))]
            # names are not enough: a user's folder (or link) named summary.json is not a result file
            odd = [f"{p.name} ({kind})" for p in entries if p.name not in foreign and (kind := not_a_file(p))]
            if odd:
                raise ResultsError(
                    f"{final}: holds {', '.join(odd[:3])}{', ...' if len(odd) > 3 else ''} where apcsim writes a "
                    f"result file; it would be replaced whole, so apcsim refuses: move it or pick another --out"
                )
            if foreign:
                raise ResultsError(
                    f"{final}: holds files that are not apcsim results ({', '.join(foreign[:3])}"
                    f"{', ...' if len(foreign) > 3 else ''}); it would be replaced whole, so apcsim refuses: "
                    f"move them or pick another --out"
                )

    # -- after the files are written ---------------------------------------------------------
    def commit(self) -> Path:
        """Swap the temporary folder in as the results folder (see the module docstring)."""
        if self.tmp is None:
            raise ResultsError(f"{self.final}: commit without open")
        tmp, final = self.tmp, self.final
        for name in OWN_SUBFOLDERS:  # copied, not moved: until the swap the old folder stays whole
            if _own_subfolder(final / name):
                shutil.copytree(final / name, tmp / name)
        if not final.exists():
            os.rename(tmp, final)
            self.tmp = None
        elif _exchange(tmp, final):
            shutil.rmtree(tmp, ignore_errors=True)  # the old results, now at the temporary name
            self.tmp = None
        else:
            old = final.with_name(f".old-{final.name}-{tmp.name.rsplit('-', 1)[-1]}")
            os.rename(final, old)
            os.rename(tmp, final)
            self.tmp = None
            shutil.rmtree(old, ignore_errors=True)
        return final

    def abort(self) -> None:
        """Drop the temporary folder (the results folder is left as it is)."""
        if self.tmp is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)
            self.tmp = None

    def state(self, run_id: str | None = None) -> str:
        """What the results folder holds now, as one phrase for a message (read from disk)."""
        meta = read_meta(self.final)
        if run_id is not None and meta.get("run_id") == run_id:
            return f"{self.final} holds this run's complete results"
        if meta.get("complete") is True:
            return f"{self.final} still holds the previous complete results"
        if self.final.exists():
            return f"{self.final} is unchanged"
        return f"nothing was written to {self.final}"

    def close(self) -> None:
        """Abort if not committed, release the lock."""
        try:
            self.abort()
        finally:
            if self._lock_fd is not None:
                os.close(self._lock_fd)
                self._lock_fd = None

    def __enter__(self) -> ResultsFolder:
        if self._lock_fd is not None:
            return self
        try:
            return self.open()
        except KeyboardInterrupt as exc:
            self._finish(exc)
            raise

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        """Close; a ``KeyboardInterrupt`` inside the block (or while closing) becomes
        :class:`RunInterrupted` saying what the folder holds now."""
        self._finish(exc if isinstance(exc, KeyboardInterrupt) else None)

    def _finish(self, interrupt: BaseException | None) -> None:
        try:
            self.close()
        except KeyboardInterrupt as again:  # a second Ctrl-C while cleaning up: clean up anyway
            interrupt = interrupt or again
            self.close()
        if interrupt is not None and not isinstance(interrupt, RunInterrupted):
            raise RunInterrupted(f"interrupted: {self.state(self.run_id)}") from None

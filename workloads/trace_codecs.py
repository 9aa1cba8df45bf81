"""A trace file's bytes, decompressed and checked to its end (mirrors nothing in vLLM).

:func:`open_checked` opens a trace by suffix -- ``.gz`` (stdlib ``gzip``), ``.xz`` (stdlib
``lzma``), ``.zst`` (the ``zstandard`` package), anything else as plain bytes -- and returns a
buffered binary reader whose every failure is a :class:`TraceInputError` naming the file:

* **Truncation is an error, never a shorter trace.** ``gzip`` and ``lzma`` raise ``EOFError`` on a
  stream cut short; ``zstandard.open`` does not (a file cut inside its second frame reads as the
  first frame plus whatever the cut frame decoded to, and ends without a word). So ``.zst`` is
  read frame by frame through ``ZstdDecompressor.decompressobj``: each object decodes one frame and
  says ``eof`` at its end, ``unused_data`` starts the next; input that ends while a frame is open
  is a truncated file. (A file cut exactly between frames decodes to whole frames and cannot be
  told from a shorter file; no codec can, as gzip members cannot either.)
* **Corrupt data** (``zlib.error``, ``BadGzipFile``, ``LZMAError``, ``ZstdError``) and **read
  errors** (``PermissionError``, ``EIO``) become one line each: ``file: problem``.
* **Not a regular file**: a directory, a FIFO, a device are refused by kind, a missing path as
  missing (``FileNotFoundError``, as ``open`` raises; so a FIFO is never reported as ``no such file``).

Truncation is not a bad *line*: ``skip_bad_lines`` does not skip it (the error comes from the
reader, below the line parser).

Invariant: a read never returns ``b""`` before the end of the last complete frame or stream.
Imports the stdlib only (``zstandard`` when a ``.zst`` is opened).
"""

from __future__ import annotations

import errno
import io
import lzma
import os
import stat
import zlib
from pathlib import Path
from typing import Any, BinaryIO, cast

from sim.core.errors import ApcsimError

ZST_READ_BYTES = 1 << 16
"""Compressed bytes fed to the zstd decoder per step: its output per step stays a few MiB even at
high compression ratios."""


class TraceInputError(ApcsimError, ValueError):
    """A trace path that cannot be read as a trace (missing, not a regular file, a missing codec,
    corrupt or truncated compressed data, a read error)."""


_DECODE_ERRORS: tuple[type[BaseException], ...] = (EOFError, zlib.error, lzma.LZMAError, OSError)


def _problem(exc: BaseException, suffix: str) -> str:
    if isinstance(exc, EOFError):
        return f"truncated {suffix} file (the compressed stream ends early)"
    if isinstance(exc, PermissionError):
        return "permission denied"
    if isinstance(exc, OSError) and exc.errno is not None:
        return os.strerror(exc.errno)
    return f"corrupt {suffix} data ({str(exc).strip() or type(exc).__name__})"


class _Checked(io.RawIOBase):
    """A raw reader over ``inner`` translating its decoder and OS errors (see the module docstring)."""

    def __init__(self, path: Path, inner: Any, suffix: str) -> None:
        super().__init__()
        self._path, self._inner, self._suffix = path, inner, suffix

    def readable(self) -> bool:
        return True

    def readinto(self, buf: Any) -> int:
        try:
            return int(self._inner.readinto(buf))
        except TraceInputError:
            raise
        except _DECODE_ERRORS as exc:
            raise TraceInputError(f"{self._path}: {_problem(exc, self._suffix)}") from None
        except Exception as exc:  # zstandard.ZstdError (any other decoder error is one too)
            if type(exc).__module__.startswith("zstandard"):
                raise TraceInputError(f"{self._path}: {_problem(exc, self._suffix)}") from None
            raise

    def close(self) -> None:
        try:
            self._inner.close()
        finally:
            super().close()


class _ZstdFrames(io.RawIOBase):
    """Decodes a ``.zst`` file frame after frame; input ending inside a frame raises."""

    def __init__(self, path: Path, fh: BinaryIO, zstandard: Any) -> None:
        super().__init__()
        self._path, self._fh = path, fh
        self._dctx = zstandard.ZstdDecompressor()
        self._frame: Any = None  # the open frame's decoder; None between frames
        self._out = b""
        self._at = 0

    def readable(self) -> bool:
        return True

    def _feed(self, data: bytes) -> bytes:
        parts = []
        while data:
            if self._frame is None:
                self._frame = self._dctx.decompressobj()
            parts.append(self._frame.decompress(data))
            if not self._frame.eof:
                break
            data = self._frame.unused_data  # the next frame starts here
            self._frame = None
        return b"".join(parts)

    def readinto(self, buf: Any) -> int:
        while self._at == len(self._out):
            chunk = self._fh.read(ZST_READ_BYTES)
            if not chunk:
                if self._frame is not None:
                    raise TraceInputError(f"{self._path}: truncated .zst file (it ends inside a compressed frame)")
                return 0
            self._out, self._at = self._feed(chunk), 0
        n = min(len(buf), len(self._out) - self._at)
        buf[:n] = self._out[self._at:self._at + n]
        self._at += n
        return n

    def close(self) -> None:
        try:
            self._fh.close()
        finally:
            super().close()


def check_trace_path(p: Path) -> None:
    """Refuse a path that is not a readable regular file, by kind (see the module docstring)."""
    try:
        mode = os.stat(p).st_mode
    except FileNotFoundError:  # a FileNotFoundError, as open() raises: the CLI prints "<path>: no such file"
        raise FileNotFoundError(errno.ENOENT, "no such trace file", str(p)) from None
    except OSError as exc:
        raise TraceInputError(f"{p}: cannot read the trace: {_problem(exc, '')}") from None
    if stat.S_ISDIR(mode):
        raise TraceInputError(f"{p}: is a directory, expected a trace file (JSONL, optionally .gz/.xz/.zst)")
    if not stat.S_ISREG(mode):
        kind = "a FIFO" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode) else "a device"
        raise TraceInputError(f"{p}: is {kind}, not a regular file; a trace is read twice (count, replay), "
                              "so it must be a file")


def open_checked(path: str | os.PathLike[str]) -> BinaryIO:
    """``path`` opened for binary reading, decompressed by suffix and checked (module docstring)."""
    p = Path(path)
    check_trace_path(p)
    suffix = p.suffix.lower()
    try:
        fh = open(p, "rb")
    except OSError as exc:
        raise TraceInputError(f"{p}: cannot read the trace: {_problem(exc, '')}") from None
    inner: Any = fh
    if suffix == ".gz":
        import gzip

        inner = gzip.GzipFile(fileobj=fh, mode="rb")
    elif suffix == ".xz":
        inner = lzma.LZMAFile(fh, "rb")
    elif suffix == ".zst":
        try:
            import zstandard
        except ImportError:
            fh.close()
            raise TraceInputError(f"{p}: reading .zst traces needs the zstandard package "
                                  "(pip install zstandard)") from None
        inner = _ZstdFrames(p, fh, zstandard)
    if inner is not fh and suffix != ".zst":
        inner = _OwnsFile(inner, fh)
    return cast(BinaryIO, io.BufferedReader(_Checked(p, inner, suffix or "trace")))


class _OwnsFile:
    """A decoder over ``fh`` whose ``close`` closes ``fh`` too (``GzipFile(fileobj=...)`` does not)."""

    def __init__(self, inner: Any, fh: BinaryIO) -> None:
        self._inner, self._fh = inner, fh

    def readinto(self, buf: Any) -> int:
        return int(self._inner.readinto(buf))

    def close(self) -> None:
        try:
            self._inner.close()
        finally:
            self._fh.close()

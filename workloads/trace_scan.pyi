"""Type stub of the compiled trace line scanner (``trace_scan.pyx``)."""

from typing import Any

TARGET_KEYS: tuple[str, ...]

def scan_lines(buf: bytes | bytearray, n: int, final: bool) -> tuple[list[tuple[int, int, int, Any]], int]: ...

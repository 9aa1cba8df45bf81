"""Type stub of the compiled bulk decode window (``compiled_window.pyx``)."""

from array import array
from collections.abc import Sequence
from typing import Any

def bulk_steps(price: object, n_bulk: int, ctx: int, k_max: int, free_blocks: int, firsts: list[int], bs: int,
               now: float, next_arrival: float, stop_at_arrival: bool, observed: bool,
               ) -> tuple[array[float], array[float]]: ...
def put_columns(cols: list[array[Any]], columns: tuple[Sequence[Any], ...]) -> int: ...

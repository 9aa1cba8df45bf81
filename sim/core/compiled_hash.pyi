"""Type stub of the compiled fast-hash chain (``compiled_hash.pyx``)."""

from array import array

import numpy as np

def chain_runs(
    starts: np.ndarray, lengths: np.ndarray, n: int, bs: int, run_keys: np.ndarray, pos_key: np.ndarray,
    pos_mult: np.ndarray, lane_keys: np.ndarray, mult: np.ndarray, state0: int, state1: int,
) -> tuple[list[bytes], tuple[int, int]]: ...

def chain_runs_external(
    starts: np.ndarray, lengths: np.ndarray, n: int, bs: int, run_keys: np.ndarray, pos_key: np.ndarray,
    pos_mult: np.ndarray, lane_keys: np.ndarray, mult: np.ndarray, state0: int, state1: int,
) -> tuple[list[bytes], array[int], tuple[int, int]]: ...

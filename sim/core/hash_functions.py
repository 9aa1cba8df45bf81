"""The byte-exact hash functions of vLLM's ``prefix_caching_hash_algo`` (mirrors
``vllm/utils/hashing.py``: ``sha256`` -- vLLM's default --, ``sha256_cbor``, ``xxhash``,
``xxhash_cbor``), each mapping a picklable object to digest bytes.

Invariant: byte-identical to vLLM's for the same object. Imported by ``sim.core.hashing`` (which
re-exports :func:`hash_function`); cbor2 and xxhash are imported on first use. Imports neither
simpy nor torch.
"""

from __future__ import annotations

import hashlib
import pickle
from collections.abc import Callable
from typing import Any

HASH_ALGOS = ("sha256", "sha256_cbor", "xxhash", "xxhash_cbor", "fast")
"""Every ``engine.hash_algo`` (``fast`` is this project's own, ``sim.core.hashing``)."""


def _sha256(obj: Any) -> bytes:
    return hashlib.sha256(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)).digest()


def _sha256_cbor(obj: Any) -> bytes:
    import cbor2

    return hashlib.sha256(cbor2.dumps(obj, canonical=True)).digest()


def _xxhash(obj: Any) -> bytes:
    import xxhash

    return xxhash.xxh3_128_digest(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))


def _xxhash_cbor(obj: Any) -> bytes:
    import cbor2
    import xxhash

    return xxhash.xxh3_128_digest(cbor2.dumps(obj, canonical=True))


EXACT_HASH_FUNCTIONS: dict[str, Callable[[Any], bytes]] = {
    "sha256": _sha256,
    "sha256_cbor": _sha256_cbor,
    "xxhash": _xxhash,
    "xxhash_cbor": _xxhash_cbor,
}


def hash_function(name: str) -> Callable[[Any], bytes]:
    """The byte-exact hash function vLLM uses for ``prefix_caching_hash_algo=name``."""
    try:
        return EXACT_HASH_FUNCTIONS[name]
    except KeyError:
        raise ValueError(f"unknown hash algorithm {name!r}; choose one of {HASH_ALGOS}") from None

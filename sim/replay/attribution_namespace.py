"""Extra-key namespaces for the miss attribution of :mod:`sim.replay.attribution`: which extra keys
(cache salt, LoRA adapter, multimodal items) separate a request's blocks from token-equal ones.

Mirrors the extra keys of vLLM 0.25.1's ``vllm/v1/core/kv_cache_utils.py``
(``generate_block_hash_extra_keys``: LoRA name, multimodal hashes, ``cache_salt`` on block 0): two
requests with the same tokens share block hashes exactly when their namespaces are equal.

Invariants: pure functions of a request's fields. Imports only ``sim.core.request``.
"""

from __future__ import annotations

from sim.core.request import Request
from sim.replay.attribution_records import ISOLATION_LORA, ISOLATION_MM, ISOLATION_SALT

Namespace = tuple[str | None, str | None, tuple[str, ...] | None]
"""A request's extra-key namespace: (cache salt, LoRA adapter, multimodal identifiers)."""
PLAIN: Namespace = (None, None, None)
"""The shared namespace: no salt, no LoRA, no multimodal input."""
ISOLATION_CODE = {"salt": ISOLATION_SALT, "lora": ISOLATION_LORA, "mm": ISOLATION_MM}
"""The isolation cause code of each differing key."""


def namespace_of(r: Request) -> Namespace:
    """The extra keys that separate ``r``'s blocks from token-equal ones (``""`` salt = none)."""
    return (r.cache_salt or None, r.lora_name, tuple(f.identifier for f in r.mm_features) or None)


def has_extra_keys(r: Request) -> bool:
    """Whether ``r``'s namespace is not the shared one."""
    return bool(r.cache_salt or r.lora_name is not None or r.mm_features)


def differing_key(mine: Namespace, other: Namespace) -> str:
    """Which extra key tells two namespaces apart: the first of salt, LoRA, multimodal that differs."""
    if mine[0] != other[0]:
        return "salt"
    if mine[1] != other[1]:
        return "lora"
    return "mm"


def describe_namespace(ns: Namespace) -> str:
    """``salt 'a'``, ``LoRA 'x'``, ... or ``no salt, no LoRA`` for the shared namespace."""
    parts = []
    if ns[0] is not None:
        parts.append(f"salt {ns[0]!r}")
    if ns[1] is not None:
        parts.append(f"LoRA {ns[1]!r}")
    if ns[2] is not None:
        parts.append(f"multimodal {list(ns[2])}")
    return ", ".join(parts) or "no salt, no LoRA"

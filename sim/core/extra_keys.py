"""Extra keys of a block's hash, as vLLM 0.25.1 computes them (mirrors
``generate_block_hash_extra_keys`` and its helpers in ``vllm/v1/core/kv_cache_utils.py``).

In vLLM's order: the LoRA *name* on every block, ``(mm_identifier, offset - block_start)`` for every
multimodal item overlapping the block, and ``cache_salt`` on the block starting at token 0 only, and
only if truthy (``""`` behaves as no salt); an empty list becomes ``None``. vLLM 0.33.0 tags each
key (``tagged``): ``("lora", name, path)``, ``("mm", identifier, offset)``, ``("cache_salt", salt)``
(``generate_block_hash_extra_keys``); its KV events keep the untagged forms (``to_event_extra_keys``).
A resumed hash pass starts its multimodal scan at the *last* item (0.25.1's ``curr_mm_idx = -1``; 0.33.0 at the first
item overlapping the block: ``resume_from_last=False``).

Invariant: one definition for the engine's hashers (``sim.core.hashing``), the pool's KV events and
the offline bounds (``workloads.bounds``). Pure; imports ``sim.core.request`` for types only,
neither simpy nor torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from sim.core.request import MMFeature, Request


def _mm_extra_keys(
    mm_features: Sequence[MMFeature], start: int, end: int, start_mm_idx: int, tagged: bool = False
) -> tuple[list[Any], int]:
    """``(identifier, offset - start)`` (tagged: ``("mm", identifier, offset - start)``) for every
    item overlapping ``[start, end)``; vLLM's scan."""
    keys: list[Any] = []
    if not mm_features:
        return keys, start_mm_idx
    last = mm_features[-1]
    if last.offset + last.length <= start:
        return keys, start_mm_idx
    if start_mm_idx < 0:
        start_mm_idx = len(mm_features) + start_mm_idx
    idx = start_mm_idx
    while idx < len(mm_features):
        feat = mm_features[idx]
        if end > feat.offset:
            if start >= feat.offset + feat.length:
                idx += 1
                continue
            off = feat.offset - start
            keys.append(("mm", feat.identifier, off) if tagged else (feat.identifier, off))
            if end >= feat.offset + feat.length:
                idx += 1
            else:
                break
        else:
            break
    return keys, idx


def _one_block_extra_keys(
    lora_name: str | None, cache_salt: str | None, mm_features: Sequence[MMFeature], start: int, end: int,
    start_mm_idx: int, tagged: bool = False,
) -> tuple[tuple[Any, ...] | None, int]:
    mm_keys, next_idx = _mm_extra_keys(mm_features, start, end, start_mm_idx, tagged)
    keys: list[Any] = [] if lora_name is None else [_lora_key(lora_name, tagged)]
    keys.extend(mm_keys)
    if start == 0 and cache_salt:
        keys.append(("cache_salt", cache_salt) if tagged else cache_salt)
    return (tuple(keys) if keys else None), next_idx


def _lora_key(lora_name: str, tagged: bool) -> Any:
    """0.25.1: the bare name; 0.33.0: ``("lora", name, path)`` -- a trace names adapters, not their
    paths, so the path is None (one path per name: the same equality)."""
    return ("lora", lora_name, None) if tagged else lora_name


def block_extra_keys(
    request: Request, start: int, end: int, start_mm_idx: int, tagged: bool = False
) -> tuple[tuple[Any, ...] | None, int]:
    """Extra keys of the block ``[start, end)``: LoRA name, MM items, then salt on block 0 only
    (``tagged``: 0.33.0's tagged forms)."""
    return _one_block_extra_keys(request.lora_name, request.cache_salt, request.mm_features, start, end, start_mm_idx,
                                 tagged)


def blocks_extra_keys(
    lora_name: str | None, cache_salt: str | None, mm_features: Sequence[MMFeature], start: int, num_blocks: int,
    block_size: int, resume_from_last: bool = True, tagged: bool = False,
) -> list[tuple[Any, ...] | None] | None:
    """Extra keys of the ``num_blocks`` full blocks from token ``start`` of a request with these
    fields; None when no block can carry any (vLLM's ``need_extra_keys`` is false). A resumed pass
    (``start > 0``) scans the multimodal items as ``resume_from_last`` says (0.25.1: True).

    The one definition of extra keys of a hash pass: the engine's hashers (``Request`` fields) and
    the offline bounds of ``workloads.bounds`` (``TraceRequest`` fields, no multimodal items) both
    call it, so their block keys cannot diverge. Pure.
    """
    if not mm_features and lora_name is None and not cache_salt:
        return None
    if not mm_features:  # the LoRA name on every block, the salt (if truthy) on the block at token 0
        lora: tuple[Any, ...] = (_lora_key(lora_name, tagged),) if lora_name is not None else ()
        extras: list[tuple[Any, ...] | None] = [lora or None] * num_blocks
        if start == 0 and cache_salt and num_blocks:
            extras[0] = lora + ((("cache_salt", cache_salt) if tagged else cache_salt),)
        return extras
    # a resumed pass scans from the last item (0.25.1's curr_mm_idx = -1); 0.33.0 from the first item
    # overlapping the block (get_mm_features_in_window: what a scan from 0 finds): resume_from_last=False
    mm_idx = 0 if start == 0 or not resume_from_last else -1
    extras = []
    for k in range(num_blocks):
        s = start + k * block_size
        extra, mm_idx = _one_block_extra_keys(lora_name, cache_salt, mm_features, s, s + block_size, mm_idx, tagged)
        extras.append(extra)
    return extras

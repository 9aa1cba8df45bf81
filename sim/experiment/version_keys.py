"""``engine.vllm_version`` and the engine keys that exist in one vLLM version only.

Mirrors the config surface of the two versions (``vllm/config/scheduler.py`` and
``vllm/config/cache.py`` of 0.25.1 and 0.33.0): ``max_num_active_seqs`` and
``prefill_schedule_interval`` are 0.33.0 ``SchedulerConfig`` fields; 0.25.1's ``hash_block_size``
is 0.33.0's ``CacheConfig.prefix_match_unit`` (``sim.core.version_profile.VersionProfile.
hash_block_key``). Each validator here is attached to ``EngineConfig`` (``sim.experiment.config``),
so a problem is one ``ConfigError`` line naming the key.

Invariants: ``vllm_version`` is the first field of ``EngineConfig`` (the key validators read it from
the fields validated before them); an unknown version lists the supported ones. Imports neither
simpy nor torch.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationInfo

from sim.core.version_profile import DEFAULT_VERSION, PROFILES, get_profile

__all__ = ["DEFAULT_VERSION", "check_engine_keys", "check_version", "check_version_key", "hash_unit", "none_hash_seed"]

_ONLY_033 = ("max_num_active_seqs", "prefill_schedule_interval")


def check_version(value: str) -> str:
    """``engine.vllm_version``: one of the supported versions (ValueError lists them)."""
    get_profile(value)
    return value


def check_version_key(value: Any, info: ValidationInfo) -> Any:
    """A key that exists in one version only: refused (ValueError) under the other one."""
    version = info.data.get("vllm_version")
    if value is None or version not in PROFILES:
        return value
    profile = get_profile(version)
    key = info.field_name
    if key in _ONLY_033 and not profile.new_scheduler_knobs:
        raise ValueError(f"a vLLM 0.33.0 knob; engine.vllm_version {version} has no {key}")
    if key in ("hash_block_size", "prefix_match_unit") and key != profile.hash_block_key:
        raise ValueError(
            f"engine.vllm_version {version} names this key {profile.hash_block_key} "
            f"(vLLM 0.33.0 renamed hash_block_size prefix_match_unit)"
        )
    return value


def hash_unit(engine: Any) -> int | None:
    """The hash block size override of a hybrid model by either version's name (None: the GCD of
    the group sizes; without ``kv_cache_groups``, a ``prefix_match_unit`` that passed
    :func:`check_engine_keys` is the block size, so None too)."""
    if engine.kv_cache_groups is None:
        return None
    return engine.hash_block_size if engine.hash_block_size is not None else engine.prefix_match_unit


def none_hash_seed(engine: Any) -> int | str:
    """The seed of ``NONE_HASH`` (``make_block_hasher``'s ``hash_seed``): ``engine.hash_seed`` when
    set (vLLM under ``PYTHONHASHSEED``); unset, 0 under 0.25.1 (this project's historical
    default), and under 0.33.0 its ``resolve_none_hash_seed``: the fixed ``"vllm-none-hash"`` for
    the cryptographic algorithms (sha256, sha256_cbor: byte-exact with vLLM 0.33.0 run without
    PYTHONHASHSEED), 0 for xxhash* and fast (vLLM draws a random per-process seed there; any fixed
    seed gives the same hits)."""
    if engine.hash_seed is not None:
        return int(engine.hash_seed)
    fixed = get_profile(engine.vllm_version).fixed_none_hash_seed
    if fixed is not None and engine.hash_algo in ("sha256", "sha256_cbor"):
        return fixed
    return 0


def check_engine_keys(engine: Any) -> None:
    """Cross-key checks of the 0.33.0 keys (ValueError): ``max_num_active_seqs`` at most
    ``max_num_seqs`` (0.33.0 ``SchedulerConfig``), and ``resolve_kv_cache_block_sizes``' rule:
    with one KV-cache group and prefix caching on, a ``prefix_match_unit`` other than the block
    size is rejected (hits land on the block size). With several groups it is the hash block size,
    as ``hash_block_size`` was: 0.33.0's sub-block hits (``partial_hash_hits_enabled``) need a Mamba
    group in align mode, which ``kv_cache_groups`` cannot express, so full and sliding-window groups
    hit on the scheduler block size in both versions."""
    active = engine.max_num_active_seqs
    if active is not None and active > engine.max_num_seqs:
        raise ValueError(f"max_num_active_seqs ({active}) cannot be greater than max_num_seqs "
                         f"({engine.max_num_seqs}), as vLLM 0.33.0 requires")
    unit = engine.prefix_match_unit
    if unit is None or not engine.enable_prefix_caching:
        return
    groups = engine.kv_cache_groups
    if groups is None or len(groups) == 1:
        bs = engine.block_size if groups is None else groups[0].block_size
        if unit != bs:
            raise ValueError(
                f"prefix_match_unit={unit}: with a single KV cache group, prefix-cache hits land on the "
                f"block size ({bs}); unset it or set it to {bs}"
            )

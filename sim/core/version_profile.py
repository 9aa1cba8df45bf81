"""vLLM version profiles: what differs between the two scheduler versions apcsim mirrors, as data.

apcsim reimplements one scheduler; the behaviours that changed between vLLM 0.25.1 and 0.33.0
(read from the two wheels' ``vllm/v1/core``, ``vllm/v1/metrics/stats.py`` and ``vllm/config``) are
switched by the fields of one frozen :class:`VersionProfile`, resolved once in
``sim.experiment.engine_description`` and handed to the core through ``SchedulerConfig.profile``:

* ``stats_at_admission`` -- 0.33 ``KVCacheManager.record_prefix_cache_stats``, called by
  ``Scheduler.schedule`` once ``allocate_slots`` has admitted a waiting request ("Record at
  admission so unscheduled lookups are not counted"); 0.25.1 ``get_computed_blocks`` recorded every
  lookup, a blocked head's included.
* ``eagle_lookahead_hashes`` -- 0.33 ``VllmConfig.num_hash_lookahead_tokens`` (1 for EAGLE with
  prefix caching and no KV connector): each block hash also covers the next token
  (``get_request_block_hasher``), so ``Scheduler.__init__`` sets ``use_eagle_block_drop = False``;
  0.25.1 dropped the last hit block (``use_eagle``).
* ``hash_block_key`` -- the config key of the hash granularity: ``hash_block_size`` (0.25.1) or
  ``prefix_match_unit`` (0.33 ``CacheConfig``; ``resolve_kv_cache_block_sizes`` rejects any value
  other than the block size with one KV-cache group).
* ``stale_output_skip`` -- 0.33 ``_preempt_request`` sets ``num_stale_output_tokens =
  num_in_flight_tokens``; the waiting loop skips (``skip_request``) such a request until
  ``update_from_output`` has drained it.
* ``threshold_off_when_alone`` -- 0.33 ``schedule``: ``long_prefill_token_threshold`` is 0 when
  ``num_running + num_waiting <= 1``.
* ``new_scheduler_knobs`` -- 0.33 ``SchedulerConfig.max_num_active_seqs`` (admission cap into
  RUNNING) and ``prefill_schedule_interval`` (the local prefill cadence).
* ``in_flight_admission_cap`` -- 0.33 ``KVCacheManager(max_in_flight_tokens=...)``:
  ``VllmConfig.max_in_flight_tokens = max_concurrent_batches * max_num_batched_tokens`` (2 batches
  with async scheduling) sizes the sliding-window admission cap; 0.25.1 used
  ``max_num_batched_tokens``.
* ``fixed_none_hash_seed`` -- 0.33 ``resolve_none_hash_seed``: without ``PYTHONHASHSEED`` the
  cryptographic hashes seed ``NONE_HASH`` with ``"vllm-none-hash"``; 0.25.1 had no fixed seed.
* ``mm_resume_scan_from_last`` -- the multimodal scan of a resumed hash pass (a block completed by
  output tokens): 0.25.1 ``get_request_block_hasher`` starts at the *last* item
  (``curr_mm_idx = -1``), so of several items overlapping the prompt's tail block only the last
  becomes an extra key; 0.33.0 starts at the first item overlapping the block
  (``get_mm_features_in_window``).
* ``tagged_extra_keys`` -- 0.33.0 ``generate_block_hash_extra_keys`` tags every extra key:
  ``("lora", name, path)``, ``("mm", identifier, offset)``, ``("cache_salt", salt)`` (the hash bytes
  change, and a LoRA name can no longer equal a salt; KV events keep the bare forms).
* ``threshold_within_max_model_len`` -- 0.33 ``SchedulerConfig.verify_max_model_len`` refuses a
  ``long_prefill_token_threshold`` above ``max_model_len`` always; 0.25.1 only with
  ``max_num_partial_prefills > 1`` (which apcsim does not model), so never.
* ``priority_preemption_scans_on`` -- 0.33's priority preemption in the running loop: the cursor
  steps back when the victim sat before it (scheduled or not), and a request that preempted
  itself lets the loop go on to the higher-priority ones behind it; 0.25.1 stepped back only for a
  victim scheduled this step and stopped.

Invariants: profiles are immutable module constants looked up by version string; nothing else in
the project compares version strings. Imports nothing from the project.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class VersionProfile:
    """The behaviour switches of one vLLM version (see the module docstring for each field)."""

    version: str
    stats_at_admission: bool
    eagle_lookahead_hashes: bool
    hash_block_key: str
    stale_output_skip: bool
    threshold_off_when_alone: bool
    new_scheduler_knobs: bool
    in_flight_admission_cap: bool
    fixed_none_hash_seed: str | None
    priority_preemption_scans_on: bool
    threshold_within_max_model_len: bool
    mm_resume_scan_from_last: bool
    tagged_extra_keys: bool

    def max_in_flight_tokens(self, max_num_batched_tokens: int, async_scheduling: bool) -> int:
        """Query: the tokens the sliding-window admission cap reserves for (0.33
        ``VllmConfig.max_in_flight_tokens`` with one pipeline stage: two concurrent batches with
        async scheduling; 0.25.1: ``max_num_batched_tokens``)."""
        if self.in_flight_admission_cap and async_scheduling:
            return 2 * max_num_batched_tokens
        return max_num_batched_tokens


V0_25_1 = VersionProfile(
    version="0.25.1",
    stats_at_admission=False,
    eagle_lookahead_hashes=False,
    hash_block_key="hash_block_size",
    stale_output_skip=False,
    threshold_off_when_alone=False,
    new_scheduler_knobs=False,
    in_flight_admission_cap=False,
    fixed_none_hash_seed=None,
    priority_preemption_scans_on=False,
    threshold_within_max_model_len=False,
    mm_resume_scan_from_last=True,
    tagged_extra_keys=False,
)

V0_33_0 = VersionProfile(
    version="0.33.0",
    stats_at_admission=True,
    eagle_lookahead_hashes=True,
    hash_block_key="prefix_match_unit",
    stale_output_skip=True,
    threshold_off_when_alone=True,
    new_scheduler_knobs=True,
    in_flight_admission_cap=True,
    fixed_none_hash_seed="vllm-none-hash",
    priority_preemption_scans_on=True,
    threshold_within_max_model_len=True,
    mm_resume_scan_from_last=False,
    tagged_extra_keys=True,
)

PROFILES: dict[str, VersionProfile] = {p.version: p for p in (V0_33_0, V0_25_1)}
"""Every supported version, the default first."""

DEFAULT_VERSION = V0_33_0.version


def get_profile(version: str) -> VersionProfile:
    """The profile of ``version``; raises ValueError naming the supported versions."""
    try:
        return PROFILES[version]
    except KeyError:
        raise ValueError(
            f"unknown vLLM version {version!r}; supported: {', '.join(PROFILES)}"
        ) from None

"""The engine core: vLLM 0.25.1's v1 prefix-caching path, op by op.

Bottom up: hashing (``hashing``) of a request's blocks (``request``); the block pool
(``block_pool``, over ``kv_cache_block``, ``free_block_queue``, ``block_hash_map``, emitting
``kv_events``); the per-group managers (``single_type_kv_cache_manager``,
``full_attention_manager``, ``sliding_window_manager``) and group specs (``kv_cache_spec``); the
coordinators (``kv_cache_coordinator`` interface; ``full_attention_coordinator``,
``grouped_kv_cache_coordinator``, ``hybrid_kv_cache_coordinator``) behind the one
``kv_cache_manager`` (with ``prefix_cache_stats``); the scheduler (``scheduler``, with ``config``,
``request_queue``, ``scheduler_output``); and the executor interface (``executor``) through which
time enters. Pure Python and numpy, deterministic: imports neither simpy, pandas, torch nor yaml
(checked by the import contracts in ``pyproject.toml``), and no module imports one above it.
"""

"""The engine core: vLLM 0.25.1's v1 prefix-caching path, op by op.

Hashing (``hashing``), the request (``request``), the block pool (``block_pool``), the KV cache
manager (``kv_cache_manager``) and the scheduler (``scheduler``), plus the executor interface
(``executor``) through which time enters. Pure Python and numpy, deterministic: imports neither
simpy, pandas, torch nor yaml (checked by the import contracts in ``pyproject.toml``).
"""

"""Which block pool a coordinator builds: the compiled one or the Python oracle (mirrors nothing
in vLLM: vLLM has one pool, ``vllm/v1/core/block_pool.py``; here there are two implementations of
it that must agree op for op).

* ``compiled`` (the default, ``engine.pool_impl``): :class:`sim.core.compiled_pool.CompiledBlockPool`,
  a Cython module built by ``pip install -e .``. When it is not built (no compiler at install
  time), the Python pool is used instead and one message says so, once per process.
* ``python``: :class:`sim.core.block_pool.BlockPool`, the readable reference every test checks the
  compiled pool against (same block ids, free order, hits, evictions and KV events).

Invariant: the choice changes speed only, never a result. Imports neither simpy nor torch.
"""

from __future__ import annotations

import sys
from functools import cache
from typing import Any, cast

from sim.core.block_pool import BlockPool
from sim.core.kv_events import EventSink

POOL_IMPLS = ("compiled", "python")
DEFAULT_POOL_IMPL = "compiled"


@cache
def compiled_pool_class() -> Any:
    """The compiled pool class, or None (after one message on stderr) when it is not built."""
    try:
        from sim.core.compiled_pool import CompiledBlockPool
    except ImportError as exc:
        print(
            f"apcsim: the compiled block pool is not built ({exc}); using the Python pool (same results, "
            "slower). Build it with `pip install -e .` (needs a C compiler).",
            file=sys.stderr,
        )
        return None
    return CompiledBlockPool


def make_block_pool(
    num_gpu_blocks: int,
    enable_caching: bool = True,
    event_sink: EventSink | None = None,
    impl: str = DEFAULT_POOL_IMPL,
) -> BlockPool:
    """A block pool of ``impl`` (see the module docstring); raises ValueError for an unknown one."""
    if impl == "python":
        return BlockPool(num_gpu_blocks, enable_caching, event_sink)
    if impl != "compiled":
        raise ValueError(f"unknown pool implementation {impl!r}; choose one of {POOL_IMPLS}")
    cls = compiled_pool_class()
    if cls is None:
        return BlockPool(num_gpu_blocks, enable_caching, event_sink)
    # a drop-in with BlockPool's methods and attributes (it is not a subclass: a C extension type)
    return cast(BlockPool, cls(num_gpu_blocks, enable_caching, event_sink))

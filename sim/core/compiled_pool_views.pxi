"""Read-only views of a compiled pool (included by ``compiled_pool.pyx``): the free queue and the
hash map, read like ``FreeKVCacheBlockQueue`` and ``BlockHashToBlockMap`` of the Python pool."""


cdef class _FreeQueueView:
    """Read-only view of the free queue (``num_free_blocks``, ``in``, ``block_ids``)."""

    cdef CompiledBlockPool _pool

    def __cinit__(self, CompiledBlockPool pool):
        self._pool = pool

    @property
    def num_free_blocks(self):
        return self._pool._nfree

    def __len__(self):
        return self._pool._nfree

    def __contains__(self, CompiledBlock block):
        return self._pool._is_free(block.block_id)

    def block_ids(self):
        return self._pool.free_block_ids()


cdef class _HashMapView:
    """Read-only view of the prefix-cache index, with the queries of ``BlockHashToBlockMap``."""

    cdef CompiledBlockPool _pool

    def __cinit__(self, CompiledBlockPool pool):
        self._pool = pool

    def __len__(self):
        return self._pool._tlive

    def get_one_block(self, key):
        cdef int32_t b = self._pool._head_of(key)
        return None if b < 0 else self._pool._block(b)

    def keys(self):
        """Query: a live set-like view of the cached keys (``BlockHashToBlockMap.keys``)."""
        return _KeysView(self)

    def __contains__(self, key):
        return self._pool._head_of(key) >= 0

    def longest_cached_prefix(self, keys):
        return self._pool.longest_cached_prefix(list(keys), 1 << 62)

    def block_ids(self, key):
        cdef int32_t b = self._pool._head_of(key)
        out = []
        while b >= 0:
            out.append(b)
            b = self._pool._link[b].hnext
        return out

    def items(self):
        """``(key, blocks)`` per key with a block, in table order."""
        cdef int32_t s, b
        cdef CompiledBlockPool pool = self._pool
        for s in range(pool._tcap):
            if pool._slots[s].klen and pool._slots[s].head != NONE:
                blocks = []
                b = pool._slots[s].head
                while b != NONE:
                    blocks.append(pool._block(b))
                    b = pool._link[b].hnext
                yield pool._slot_key(s), blocks


class _KeysView(Set):
    """The cached keys as a live set (``&`` with an iterable gives a ``set``, as a dict's keys do)."""

    __slots__ = ("_map",)

    def __init__(self, hash_map):
        self._map = hash_map

    @classmethod
    def _from_iterable(cls, it):
        return set(it)

    def __contains__(self, key):
        return key in self._map

    def __len__(self):
        return len(self._map)

    def __iter__(self):
        for key, _ in self._map.items():
            yield key

"""vLLM's 64-bit KV-event form of a block hash, read from its bytes (included by ``compiled_hash.pyx``
and ``compiled_pool.pyx``).

vLLM's KV events carry a block hash as an int: ``sim.core.hashing.external_block_hash`` takes the
hash's last 8 bytes read big-endian (the low 64 bits of the hash as a big-endian number). The chain
(``compiled_hash``) writes that word beside each key it makes; the pool (``compiled_pool``'s raw
event log) reads it from the keys it evicts. One reader for both, so the two can never disagree.
"""

from libc.stdint cimport uint64_t


cdef inline uint64_t _be64(const unsigned char* p) noexcept nogil:
    """The 8 bytes at ``p`` read big-endian, whatever the host's byte order (written out as
    shifts: gcc makes them one load and a byte swap)."""
    return ((<uint64_t>p[0] << 56) | (<uint64_t>p[1] << 48) | (<uint64_t>p[2] << 40) | (<uint64_t>p[3] << 32)
            | (<uint64_t>p[4] << 24) | (<uint64_t>p[5] << 16) | (<uint64_t>p[6] << 8) | <uint64_t>p[7])

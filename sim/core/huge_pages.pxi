"""Zeroed C tables in huge pages (included by ``sim/core/compiled_pool.pyx`` and
``sim/cluster/mask_table.pxi``): a table of 2 MiB or more gets its own anonymous mapping, aligned
to 2 MiB and advised to the kernel for transparent huge pages (``madvise(MADV_HUGEPAGE)``, Linux).

Why: the tables these modules keep (a pool's key table, the fleet's KV-event index, the active
blocks) are MiB-sized and probed at random. With 4 KiB pages nearly every probe also misses the
TLB (its page walk stalls the very prefetch meant to hide the cache miss), and filling the table
takes one page fault per 4 KiB; a 2 MiB page is one TLB entry and one fault. The default
``transparent_hugepage=madvise`` gives huge pages only to memory that asks. Elsewhere (no
``MADV_HUGEPAGE``, or the kernel declines) the mapping is plain pages, zeroed on first touch, so
the same code runs everywhere; a mapping's untouched pages cost no memory.

``apc_huge_map`` / ``apc_huge_unmap``: the mapping itself (NULL when the system refuses; the
caller raises ``MemoryError``). ``apc_huge_alloc`` / ``apc_huge_free``: ``calloc`` below 2 MiB,
the mapping from 2 MiB up (one size rule both ways, so the size picks the release).
"""

cdef extern from *:
    """
    #include <stdint.h>
    #include <stdlib.h>
    #include <sys/mman.h>
    #define APC_HUGE ((size_t)2 << 20)
    /* bytes zeroed, in an anonymous mapping aligned to 2 MiB (the slack around it unmapped) and
       advised for huge pages where the system has them */
    static void* apc_huge_map(size_t bytes) {
        char *raw, *p;
        size_t head;
        raw = (char*)mmap(NULL, bytes + APC_HUGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (raw == (char*)MAP_FAILED) return NULL;
        p = (char*)(((uintptr_t)raw + APC_HUGE - 1) & ~(uintptr_t)(APC_HUGE - 1));
        head = (size_t)(p - raw);
        if (head) munmap(raw, head);
        munmap(p + bytes, APC_HUGE - head);
    #ifdef MADV_HUGEPAGE
        madvise(p, bytes, MADV_HUGEPAGE);
    #endif
        return p;
    }
    static void apc_huge_unmap(void* p, size_t bytes) {
        if (p != NULL) munmap(p, bytes);
    }
    /* bytes zeroed: calloc below 2 MiB, else apc_huge_map */
    static void* apc_huge_alloc(size_t bytes) {
        return bytes < APC_HUGE ? calloc(bytes, 1) : apc_huge_map(bytes);
    }
    static void apc_huge_free(void* p, size_t bytes) {
        if (p == NULL) return;
        if (bytes < APC_HUGE) free(p); else munmap(p, bytes);
    }
    """
    const size_t APC_HUGE
    void* apc_huge_map(size_t bytes) nogil
    void apc_huge_unmap(void* p, size_t bytes) nogil
    void* apc_huge_alloc(size_t bytes) nogil
    void apc_huge_free(void* p, size_t bytes) nogil

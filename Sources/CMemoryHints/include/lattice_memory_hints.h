#ifndef LATTICE_MEMORY_HINTS_H
#define LATTICE_MEMORY_HINTS_H

#include <stddef.h>

/// Asks the CPU to start loading the cache line at `address` for reading (a hint: it never faults and
/// changes no state a program can observe). Swift has no prefetch of its own; the zone's frame walks
/// use this to fetch the frames a few steps ahead, which sit in separate heap blocks.
static inline void lattice_prefetch(const void *address) {
    __builtin_prefetch(address, 0, 3);
}

/// Populates the whole pages inside `count` bytes at `start` for writing, in one system call
/// (`madvise(MADV_POPULATE_WRITE)`, Linux 5.14 and later), so a fresh buffer is not faulted in a page at a
/// time on first write. A hint: where the constant is missing, or the kernel refuses, it does nothing and
/// the pages fault in as usual. It never changes the memory's contents.
void lattice_populate_for_writing(void *start, size_t count);

#endif

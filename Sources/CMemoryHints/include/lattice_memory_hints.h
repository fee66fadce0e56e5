#ifndef LATTICE_MEMORY_HINTS_H
#define LATTICE_MEMORY_HINTS_H

/// Asks the CPU to start loading the cache line at `address` for reading (a hint: it never faults and
/// changes no state a program can observe). Swift has no prefetch of its own; the zone's frame walks
/// use this to fetch the frames a few steps ahead, which sit in separate heap blocks.
static inline void lattice_prefetch(const void *address) {
    __builtin_prefetch(address, 0, 3);
}

#endif

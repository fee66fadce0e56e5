// lattice_prefetch is a static inline function in include/lattice_memory_hints.h; the page population
// hint needs the system headers, so it lives here.
#define _DEFAULT_SOURCE
#include "lattice_memory_hints.h"

#include <stdint.h>
#include <sys/mman.h>
#include <unistd.h>

void lattice_populate_for_writing(void *start, size_t count) {
#ifdef MADV_POPULATE_WRITE
    long page = sysconf(_SC_PAGESIZE);
    if (page <= 0 || (page & (page - 1)) != 0) return;
    uintptr_t mask = (uintptr_t)page - 1;
    uintptr_t begin = (uintptr_t)start;
    if (count > UINTPTR_MAX - begin - mask) return;
    uintptr_t first = (begin + mask) & ~mask;
    uintptr_t end = (begin + count) & ~mask;
    if (end <= first) return;
    (void)madvise((void *)first, end - first, MADV_POPULATE_WRITE);
#else
    (void)start;
    (void)count;
#endif
}

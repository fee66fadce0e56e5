// The hints are static inline functions in include/lattice_memory_hints.h; SwiftPM needs one source file.
#include "lattice_memory_hints.h"

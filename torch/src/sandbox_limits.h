// Internal to the sandbox (sandbox.cpp gives the overview): the memory bound and the counting CPU allocator, as
// the operator replacements (sandbox_ops.cpp) and the archive checks (sandbox_archive.cpp) use them. Defined in
// sandbox_limits.cpp.
#pragma once

#include <c10/core/Allocator.h>

#include <atomic>
#include <cstdint>

namespace rai::detail {

// The memory bound in bytes (0: unbounded), set once by install_allocator.
extern std::atomic<uint64_t> g_limit;

// Throws the memory-bound error (libtorch's OutOfMemoryError) for a request of `asked` bytes.
[[noreturn]] void over_memory(uint64_t asked);

// The size a block of the counting allocator was allocated with; false if `dp` is not the allocator's.
bool counted_size(const c10::DataPtr& dp, uint64_t* n);

// The counting allocator, held to `memory_bound` bytes, as libtorch's CPU allocator.
void install_allocator(uint64_t memory_bound);

inline uint64_t add_sat(uint64_t a, uint64_t b) { return a + b < a ? UINT64_MAX : a + b; }

}  // namespace rai::detail

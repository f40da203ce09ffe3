// Internal to the sandbox (sandbox.cpp gives the overview): libtorch operators replaced by checked versions.
// Defined in sandbox_ops.cpp.
#pragma once

namespace rai::detail {

// String, list and view ops that allocate (or describe) more than their inputs: each first estimates its result
// and refuses past the memory bound.
void bound_ops();

// Ops that return memory they have not written (the empty family, resizes): their results zeroed where the
// counting allocator did not already zero them (GPU and pinned memory).
void scrub_ops();

}  // namespace rai::detail

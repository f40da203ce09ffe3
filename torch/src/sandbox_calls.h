// Internal to the sandbox (sandbox.cpp gives the overview): the call graph of compiled code, bounded in depth and
// in size once every call is inlined. Defined in sandbox_calls.cpp.
#pragma once

#include <cstdint>
#include <vector>

namespace torch::jit {
struct Function;
}  // namespace torch::jit

namespace rai::detail {

// How many functions deep calls may nest. libtorch inlines a call by recursing into the callee (the graph
// executor's first run, on the queue's worker; load-time code at torch::jit::load): each level is a run of C++
// frames. Real models nest submodules a dozen levels.
constexpr uint32_t kMaxCallDepth = 64;

// How many graph nodes a function's calls may bring in when every call is inlined (each call counted as often
// as it is made; the function's own nodes do not count). The graph executor inlines every call at a function's first run: 1 KB of functions each calling the
// next twice, 18 levels deep, took 14 s and 670 MB there, outside the kill switch and the memory bound. A
// traced BERT-base inlines to about 3,000 nodes.
constexpr uint64_t kMaxInlinedNodes = 1 << 17;

// Refuses a call graph over `fns` (and whatever they call) that nests deeper than kMaxCallDepth, inlines more
// than kMaxInlinedNodes, or has a cycle (libtorch refuses recursion itself; this does not rely on it). Iterative:
// the graph is what may be deep.
void check_calls(const std::vector<torch::jit::Function*>& fns, bool script);

}  // namespace rai::detail

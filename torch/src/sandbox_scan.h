// Internal to the sandbox (sandbox.cpp gives the overview): the hand-written scanners of untrusted input, which
// read a model's pickles and TorchScript source without running or building anything. Each throws Refused
// (sandbox_policy.h). Defined in sandbox_scan.cpp; unit-tested by torch/tests/sandbox_scan_test.cpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace torch::jit {
struct Source;
}  // namespace torch::jit

namespace rai::detail {

constexpr size_t kMaxPickleDepth = 1000;  // nesting that destroying the values cannot overflow the stack with

// Walks a pickle the way torch::jit::Unpickler does, without building anything: the classes it names, and
// the graph of containers it builds (depth and cycles: libtorch destroys values recursively). `record` names the
// pickle in the refusal.
void scan_pickle(const std::string& record, const uint8_t* p, size_t n);

// How deep TorchScript source can make the parser, the compiler and the trees they build recurse, estimated
// from its tokens (libtorch's lexer is iterative): open brackets, operator chains inside them (a + b + c is a
// tree as deep as the chain; commas start a new element), calls and attribute chains, indentation and elif
// chains (each counted twice: the compiler spends more stack on statements). 2,000 levels of parentheses or
// 1,000 elifs overflow a 2 MB thread (measured); the limit leaves a wide margin and no real code nears it.
constexpr int kMaxSourceDepth = 256;

// How many functions and methods (`def`s) a model's code or a script may define. libtorch compiles a callee
// when its caller's compilation reaches the call, by recursion, so a chain of N functions is N levels of
// compiler frames (~400 overflowed a 2 MB thread); the shim compiles on a thread whose stack holds this many
// (kCompileStack). Models define a forward per submodule class: a few hundred to a few thousand.
constexpr int kMaxFunctions = 10000;

// Refuses source nested deeper than kMaxSourceDepth ("TORCH script refused: ..." or "TORCH model refused: ...").
// Returns the number of functions and methods it defines (`def`s), for kMaxFunctions.
int check_source_depth(const std::shared_ptr<torch::jit::Source>& src, bool script);

// Names of the classes a code file defines, parsed as SourceImporter does.
std::vector<std::string> class_names(const std::shared_ptr<torch::jit::Source>& src);

}  // namespace rai::detail

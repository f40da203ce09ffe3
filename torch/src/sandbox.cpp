// The TORCH backend's sandbox. Models and scripts are untrusted input: a client that may store one must not reach
// the server's files, network or processes, load code, or take Redis down. What TorchScript can reach in this
// libtorch (2.13) was enumerated from its registries (torch::jit::getAllOperators(): 4,231 operators in 21
// namespaces; torch.classes: 19 custom classes); this file refuses what is dangerous and bounds the rest.
//
// 1. Code. Every function of a model (every method of every class in its archive and every function they call)
//    and of a script is compiled and walked, node by node through nested blocks and subgraphs, before anything
//    runs. Operators outside an allowlist of namespaces (namespace_reason), denied operators inside it
//    (denied_ops), custom classes outside an allowlist (class_reason), classes that contain themselves, and the
//    formatting of objects (their text holds a memory address) are refused with an error naming what was found.
// 2. Load-time code. torch::jit::load runs TorchScript `__setstate__` methods while it unpickles, before anyone
//    could look at the graphs. So a model archive is checked first (precheck_archive): no flatbuffer, every
//    pickle walked without being run (its classes, its nesting depth, no cycles), every class of its code
//    compiled into a scratch compilation unit and checked, its tensors unpickled and checked against their
//    storage, and no loop reachable from a `__setstate__` (nothing else bounds code run at load).
// 3. Stack. libtorch parses, compiles, destroys and prints recursively: source nested deeper than
//    kMaxSourceDepth is refused before it is parsed, and values stored through `Any` (the only way to nest a
//    value in itself level after level) are checked at run time against kMaxValueDepth and cycles.
// 4. Memory. A counting CPU allocator (every tensor libtorch allocates on the CPU) refuses past the bound and
//    zeroes what it hands out (ops like torch.empty return memory they have not written, which held another
//    client's data); string and list ops that allocate outside tensors are replaced by versions that check their
//    result size; loops measure what the run holds outside tensors (the values each loop can reach).
// 5. Time. Every loop body starts with redisai::check_deadline(), which throws once the run's deadline
//    (MODEL_EXECUTION_TIMEOUT) has passed; the allocator checks it too, so long straight-line code stops as well.
//    What no loop or allocation interrupts (one long kernel) runs to its end.
//
// The sandbox's files (sandbox.h is what shim.cpp calls; the other headers are internal to the sandbox):
//   sandbox.cpp          this overview, and init(), which installs the sandbox's parts in libtorch
//   sandbox_policy.cpp   1 and 3: the refused operators, namespaces and classes, the walk of compiled code, and
//                        the instrumentation of admitted code (admit_model, admit_script)
//   sandbox_archive.cpp  2: the model archive checked before torch::jit::load (precheck_archive), and a script's
//                        source before it is compiled (check_script_source)
//   sandbox_scan.cpp     2 and 3: the hand-written scanners of untrusted input: pickles, and source nesting and
//                        class names (unit-tested by torch/tests/sandbox_scan_test.cpp)
//   sandbox_limits.cpp   3 to 5: the counting allocator, each run's deadline and the measure of what it holds, the
//                        depth check of stored values (RunScope, QuietScope, failure, live_bytes)
//   sandbox_ops.cpp      4: string, list and view ops bounded before they run, and ops that return memory they
//                        have not written zeroing it

#include "sandbox.h"

#include "sandbox_limits.h"
#include "sandbox_ops.h"

#include <ATen/Context.h>
#include <torch/csrc/jit/runtime/print_handler.h>

#include <mutex>

namespace rai {
namespace {

void silent_print(const std::string&) {}

}  // namespace

void init(uint64_t memory_bound) {
  static std::once_flag once;
  std::call_once(once, [memory_bound] {
    detail::install_allocator(memory_bound);
    at::globalContext().setCheckSparseTensorInvariants(true);
    torch::jit::setPrintHandler(&silent_print);
    detail::bound_ops();
    detail::scrub_ops();
  });
}

}  // namespace rai

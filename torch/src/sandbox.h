// The TORCH backend's sandbox: models and scripts are untrusted input. See sandbox.cpp for what is refused
// and why; shim.cpp calls these around every load, compile and run.
#pragma once

#include <torch/script.h>

#include <cstdint>
#include <functional>
#include <string>

namespace rai {

// Once, before any model or script: the counting CPU allocator held to `memory_bound` bytes (0: unbounded),
// bounded versions of the string/list ops that can allocate without a tensor, and silent print handler.
void init(uint64_t memory_bound);

// Before torch::jit::load: the archive's format, every pickle (classes, nesting), every tensor (bounds against
// its storage), and every function of its code compiled and checked without running anything. Throws the
// refusal (a std::runtime_error whose text starts with "TORCH model refused:").
void precheck_archive(const char* data, size_t len);

// Before compiling a script: refuses source nested deeper than the compiler's stack allows.
void check_script_source(const std::string& source);

// After loading / compiling: checks every function of the compilation unit once more and instruments every
// loop with the deadline check. Throws the refusal.
void admit_model(const torch::jit::Module& m);
void admit_script(const torch::jit::CompilationUnit& cu);

// One run (a model's forward, a script function): its deadline (MODEL_EXECUTION_TIMEOUT, 0: none; nested runs
// keep the earliest), warnings dropped. Restores the previous state when it ends.
class RunScope {
 public:
  explicit RunScope(uint64_t timeout_ms);
  ~RunScope();
  RunScope(const RunScope&) = delete;
  RunScope& operator=(const RunScope&) = delete;

 private:
  int64_t saved_deadline_;
  uint64_t saved_timeout_;
  int64_t saved_next_state_;
  size_t saved_loops_;
  uint64_t saved_id_;
  void* saved_handler_;
};

// The stack of the thread that loads models and compiles scripts: libtorch compiles a chain of calls by
// recursion, one run of compiler frames per function, and the source may define kMaxFunctions (10,000)
// functions (sandbox_scan.h). Measured: about 6 KB a level (a chain of 300–400 overflows a 2 MB thread, of
// 1,000–1,500 an 8 MB one; 20,000 compile in 256 MB); the pages are reserved, and only those a compile
// touches are ever backed by memory.
constexpr size_t kCompileStack = size_t{256} << 20;

// Runs `fn` on a new thread with a kCompileStack stack, waits for it, and rethrows what it threw: loads and
// compiles run there, whichever thread asked (a build thread, Redis's main thread at RESTORE or RDB load).
void on_compile_stack(const std::function<void()>& fn);

// Warnings dropped (loads and compiles run no model code but libtorch may still warn).
class QuietScope {
 public:
  QuietScope();
  ~QuietScope();
  QuietScope(const QuietScope&) = delete;
  QuietScope& operator=(const QuietScope&) = delete;

 private:
  void* saved_handler_;
};

// What a load, compile or run failed with: its kind, as the return codes of src/backends/torch_abi.rs
// (kFailedCode: anything else), and the text to reply. The sandbox's refusals are their own type; its stops of a
// run (the deadline, the memory bound, values too deep) are recorded where they fire, since TorchScript wraps
// them in its traceback: the reply is the plain text, the kind is known without reading any message.
constexpr int kFailedCode = 1, kRefusedCode = 3, kTimedOutCode = 4, kMemoryCode = 5;
struct Failure {
  int code;
  std::string text;
};
// `e`: what was caught (null: not a std::exception). Called from the catch of each shim function.
Failure failure(const std::exception* e);

// Live bytes held through the counting allocator.
uint64_t live_bytes();

// The next block of exactly `n` bytes this thread allocates is written whole by the caller before anything
// reads it (an input's copy), so the allocator does not zero it; any other allocation, or 0, drops the hint.
void next_block_written(uint64_t n);

}  // namespace rai

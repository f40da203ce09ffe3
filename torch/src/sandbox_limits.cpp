// The sandbox's run-time limits (sandbox.cpp gives the overview, sections 3 to 5): the counting CPU allocator
// (the memory bound, and zeroing what it hands out), each run's deadline, the measure of what a run holds
// outside tensors, the depth and cycle check of stored values, and the scopes shim.cpp puts around runs.

#include "sandbox_limits.h"

#include "sandbox.h"
#include "sandbox_policy.h"

#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>
#include <torch/csrc/jit/runtime/custom_operator.h>
#include <torch/csrc/jit/runtime/operator.h>

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <exception>
#include <functional>
#include <cstring>
#include <ctime>
#include <stdexcept>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace rai {
namespace detail {

std::atomic<uint64_t> g_limit{0};

namespace {

using torch::jit::Node;
using torch::jit::Stack;

// ---- the counting CPU allocator -----------------------------------------------------------------------------

// Keeps alloc_cpu's 64-byte alignment; the first 8 bytes hold the size, the next 8 the run that allocated it.
constexpr size_t kHeader = 64;
std::atomic<uint64_t> g_live{0};
std::atomic<uint64_t> g_run_ids{0};
const char kMemoryError[] = "TORCH memory limit exceeded, memory allocation failed.";
const char kTimeoutError[] = "TORCH: the run was cancelled after MODEL_EXECUTION_TIMEOUT";
const char kDepthError[] = "TORCH: values nested deeper than";
const char kCycleError[] = "TORCH: a value cannot contain itself";

// The coarse monotonic clock: a vDSO read of the last tick (a few ns, a few ms of resolution), which is all a
// deadline of at least MODEL_EXECUTION_TIMEOUT's 1000 ms needs, in every loop iteration and allocation.
int64_t now_ns() {
  timespec ts;
  ::clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

// The precise monotonic clock, to time the walks of check_deadline.
int64_t precise_ns() {
  timespec ts;
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

// The run on this thread (RunScope).
struct RunLimits {
  int64_t deadline_ns = 0;  // 0: none
  uint64_t timeout_ms = 0;
  int64_t next_state_ns = 0;  // when a loop may next measure the run's state (check_deadline)
  size_t loops = 0;            // tl_loops.size(), read here by every iteration (tl_loops' TLS costs more)
  uint64_t id = 0;             // this run's number (RunScope; a nested run has its own), 0: none
};
thread_local RunLimits tl_run;
// The sandbox's own stop of the run on this thread (the deadline, the memory bound, a value too deep or cyclic),
// recorded as it is thrown: TorchScript wraps an op's error in its traceback, so by the shim's catch its type is
// gone (failure() reads it). Cleared when an outermost run starts and when failure() takes it outside any run.
thread_local Failure tl_stop{0, ""};
thread_local int tl_depth = 0;  // RunScopes open on this thread (a script's model_execute nests one)
// What the loops running on this thread use from outside themselves (redisai::loop_enter), innermost last.
thread_local std::vector<std::vector<c10::IValue>> tl_loops;

// Stops the run with `text`, recorded as a failure of kind `code` for failure().
[[noreturn]] void stop(int code, const std::string& text) {
  tl_stop = {code, text};
  TORCH_CHECK(false, text);
  throw std::logic_error("unreachable");
}

[[noreturn]] void timed_out() {
  stop(kTimedOutCode, std::string(kTimeoutError) + " (" + std::to_string(tl_run.timeout_ms) + " ms)");
}

// A value nested too deep or containing itself: refused, in the sandbox's words.
[[noreturn]] void value_bound(const std::string& text) { stop(kFailedCode, text); }

}  // namespace

[[noreturn]] void over_memory(uint64_t asked) {
  tl_stop = {kMemoryCode, kMemoryError};  // RedisAI's text (as ONNX's); the details stay in the exception
  TORCH_CHECK_WITH(OutOfMemoryError, false, kMemoryError, " (", asked, " bytes asked, ",
                   g_live.load(std::memory_order_relaxed), " held, bound ", g_limit.load(std::memory_order_relaxed),
                   ")");
  throw std::logic_error("unreachable");
}

namespace {

// A block's header (kHeader): the size asked for, and the run that allocated it.
uint64_t size_of(const void* base) {
  uint64_t n;
  std::memcpy(&n, base, sizeof n);
  return n;
}
uint64_t owner_of(const void* base) {
  uint64_t id;
  std::memcpy(&id, static_cast<const char*>(base) + sizeof(uint64_t), sizeof id);
  return id;
}

// Blocks a run allocated and freed, on the thread that runs it, kept for that run's next allocations of the same
// size: they held only what the run itself wrote, so they are handed back without zeroing (a loop that makes
// fresh tensors, as torch_slow.pt does, paid one write pass over each: +14 %). A run's blocks leave when it ends.
// Bounded, as what the memory bound does not count.
struct ReuseCache {
  static constexpr size_t kBlocks = 16;
  static constexpr uint64_t kBytes = uint64_t{32} << 20;
  void* blocks[kBlocks];
  size_t count = 0;
  uint64_t bytes = 0;

  bool put(void* base, uint64_t n) {
    if (count == kBlocks || bytes + n > kBytes) return false;
    blocks[count++] = base;
    bytes += n;
    return true;
  }
  // A block of `n` bytes that run `id` freed, or null.
  void* take(uint64_t n, uint64_t id) {
    for (size_t i = 0; i < count; ++i) {
      if (size_of(blocks[i]) == n && owner_of(blocks[i]) == id) {
        void* b = blocks[i];
        blocks[i] = blocks[--count];
        bytes -= n;
        return b;
      }
    }
    return nullptr;
  }
  // Frees the blocks of run `id` (all: 0).
  void release(uint64_t id) {
    for (size_t i = 0; i < count;) {
      if (id && owner_of(blocks[i]) != id) {
        ++i;
        continue;
      }
      bytes -= size_of(blocks[i]);
      c10::free_cpu(blocks[i]);
      blocks[i] = blocks[--count];
    }
  }
  ~ReuseCache() { release(0); }
};
thread_local ReuseCache tl_reuse;

void counted_free(void* p) {
  if (!p) return;
  char* base = static_cast<char*>(p) - kHeader;
  const uint64_t n = size_of(base);
  g_live.fetch_sub(n, std::memory_order_relaxed);
  if (tl_run.id && owner_of(base) == tl_run.id && tl_reuse.put(base, n)) return;
  c10::free_cpu(base);
}

}  // namespace

// The size a block of ours was allocated with; false if `dp` is not ours.
bool counted_size(const c10::DataPtr& dp, uint64_t* n) {
  if (dp.get_deleter() != &counted_free || !dp.get()) return false;
  *n = size_of(static_cast<const char*>(dp.get()) - kHeader);
  return true;
}

namespace {

// The size of the next block this thread allocates that its caller writes whole before anything reads it
// (next_block_written); 0: none.
thread_local uint64_t tl_written = 0;

struct CountingAllocator final : c10::Allocator {
  c10::DataPtr allocate(size_t n) override {
    const bool written = n && tl_written == n;
    tl_written = 0;
    if (tl_run.deadline_ns && now_ns() > tl_run.deadline_ns) timed_out();
    const uint64_t limit = g_limit.load(std::memory_order_relaxed);
    if (n > SIZE_MAX / 2) over_memory(n);
    const uint64_t after = g_live.fetch_add(n, std::memory_order_relaxed) + n;
    if (limit && after > limit) {
      g_live.fetch_sub(n, std::memory_order_relaxed);
      over_memory(n);
    }
    void* base = tl_run.id ? tl_reuse.take(n, tl_run.id) : nullptr;
    if (base) {
      void* p = static_cast<char*>(base) + kHeader;  // this run's own bytes: not zeroed (ReuseCache)
      return {p, p, &counted_free, c10::Device(c10::DeviceType::CPU)};
    }
    try {
      base = c10::alloc_cpu(n + kHeader);
    } catch (...) {
      g_live.fetch_sub(n, std::memory_order_relaxed);
      throw;
    }
    const uint64_t header[2] = {n, tl_run.id};
    std::memcpy(base, header, sizeof header);
    void* p = static_cast<char*>(base) + kHeader;
    // Zeroed before libtorch can read it: torch.empty, new_empty, resize_, out= and the like return memory they
    // have not written, and whatever it held (another client's tensors, strings, replies) would go to this
    // client. Zeroing here rather than scrubbing on free also covers memory that malloc got from elsewhere in
    // the process (the module's, other backends', Redis's when it shares the malloc), and it happens on the
    // thread of the run that asked. Cost: one write pass over each new block (docs/security.md). A block its
    // caller fills whole before anything reads it (an input's copy: next_block_written) is not zeroed.
    if (!written) std::memset(p, 0, n);
    return {p, p, &counted_free, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &counted_free; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
};

CountingAllocator g_allocator;

// ---- what a run holds outside tensors ------------------------------------------------------------------------
// Strings, lists, dicts and objects live outside the tensor allocator. Each op that makes one checks its result
// (bound_op); what a run keeps across loop iterations must be reachable from the loop's state, which
// instrument() passes to check_deadline: its walk measures what this run holds, whatever other runs, other
// backends or Redis allocate or free meanwhile (the process's resident size, used before, charged all of that
// to the run: another client's SET failed it, and another run's free hid its growth).

constexpr uint64_t kValueBytes = 16;      // an IValue (a list slot)
constexpr uint64_t kObjectBytes = 64;     // the heap object behind a string, list, dict, tuple or object
constexpr uint64_t kTensorBytes = 256;    // a TensorImpl and its StorageImpl (the data is the allocator's)
constexpr uint64_t kDictEntryBytes = 64;  // a dict entry: key, value, hash slot, order

// Elements of these types are stored in the list slot itself.
bool inline_type(const c10::TypePtr& t) {
  switch (t ? t->kind() : c10::TypeKind::AnyType) {
    case c10::TypeKind::IntType:
    case c10::TypeKind::FloatType:
    case c10::TypeKind::BoolType:
    case c10::TypeKind::NoneType:
      return true;
    default:
      return false;
  }
}

// Bytes held by the values `v` and what they reach, outside tensor data; stops once past `stop`. A string or
// tensor shell referenced from n places counts 1/n at each (the values given count in full); a container
// referenced from several places counts once. Iterative: values may nest deep.
uint64_t state_bytes(const std::vector<const c10::IValue*>& v, uint64_t stop) {
  uint64_t total = 0;
  std::vector<const c10::IValue*> todo;
  std::unordered_set<const void*> seen;
  auto leaf = [&](const c10::IValue& x, bool top) {  // true if counted here (not a container)
    if (!x.isPtrType()) return true;
    const uint64_t share = top ? 1 : std::max<size_t>(x.use_count(), 1);
    if (x.isString()) {
      total = add_sat(total, (kObjectBytes + x.toStringRef().capacity()) / share);
    } else if (x.isTensor()) {
      total = add_sat(total, kTensorBytes / share);
    } else if (!(x.isList() || x.isTuple() || x.isGenericDict() || x.isObject())) {
      total = add_sat(total, kObjectBytes / share);
    } else {
      return false;
    }
    return true;
  };
  auto container = [&](const c10::IValue& x, bool top) {
    if ((top || x.use_count() > 1) && !seen.insert(x.internalToPointer()).second) return;
    todo.push_back(&x);
  };
  for (const c10::IValue* x : v) {
    if (!leaf(*x, true)) container(*x, true);
  }
  auto child = [&](const c10::IValue& x) {
    if (!leaf(x, false)) container(x, false);
  };
  while (!todo.empty() && total <= stop) {
    const c10::IValue& x = *todo.back();
    todo.pop_back();
    if (x.isList()) {
      const auto* impl = static_cast<const c10::detail::ListImpl*>(x.internalToPointer());
      total = add_sat(total, kObjectBytes + impl->list.capacity() * kValueBytes);
      if (!inline_type(impl->elementType)) {
        for (const auto& e : impl->list) child(e);
      }
    } else if (x.isTuple()) {
      const auto& elements = x.toTupleRef().elements();
      total = add_sat(total, kObjectBytes + elements.size() * kValueBytes);
      for (const auto& e : elements) child(e);
    } else if (x.isGenericDict()) {
      const auto d = x.toGenericDict();
      total = add_sat(total, kObjectBytes + d.size() * kDictEntryBytes);
      for (const auto& e : d) {
        child(e.key());
        child(e.value());
      }
    } else if (x.isObject()) {
      const auto& slots = x.toObjectRef().slots();
      total = add_sat(total, kObjectBytes + slots.size() * kValueBytes);
      for (const auto& e : slots) child(e);
    }
  }
  return total;
}

// redisai::check_deadline(<the loop's state>...): the deadline, and each tick of the coarse clock what the
// loop's state holds outside tensors, against the bound. A walk costs time in proportion to the state, so the
// next one waits 8 times as long as this one took (at most ~1/9 of the run goes to walks); the state can grow
// in that time by what the loop makes, which is far slower per element than the walk reads it.
void check_deadline(Stack& s, size_t k) {
  auto& r = tl_run;
  const bool state = k || r.loops;
  if (!r.deadline_ns && !state) {
    torch::jit::drop(s, k);
    return;
  }
  const int64_t now = now_ns();
  if (r.deadline_ns && now > r.deadline_ns) {
    torch::jit::drop(s, k);
    timed_out();
  }
  const uint64_t limit = state && now >= r.next_state_ns ? g_limit.load(std::memory_order_relaxed) : 0;
  if (limit && s.size() >= k) {
    const int64_t t0 = precise_ns();
    std::vector<const c10::IValue*> values;
    for (const auto& loop : tl_loops) {
      for (const auto& v : loop) values.push_back(&v);
    }
    for (size_t i = s.size() - k; i < s.size(); ++i) values.push_back(&s[i]);
    const uint64_t held = state_bytes(values, limit);
    r.next_state_ns = now + std::max<int64_t>(1000000, 8 * (precise_ns() - t0));
    if (held > limit) {
      torch::jit::drop(s, k);
      tl_stop = {kMemoryCode, kMemoryError};
      TORCH_CHECK_WITH(OutOfMemoryError, false, kMemoryError, " (", held,
                       " bytes held outside tensors by the run, bound ", limit, ")");
    }
  }
  torch::jit::drop(s, k);
}

torch::jit::Operation check_deadline_op(const Node* n) {
  const size_t k = n->inputs().size();
  return [k](Stack& s) { check_deadline(s, k); };
}

// redisai::loop_enter(<what the loop uses from outside>...) / redisai::loop_exit(). A loop that throws never
// reaches its loop_exit: RunScope drops what the run's loops left.
torch::jit::Operation loop_enter_op(const Node* n) {
  const size_t k = n->inputs().size();
  return [k](Stack& s) {
    std::vector<c10::IValue> values(std::make_move_iterator(s.end() - k), std::make_move_iterator(s.end()));
    torch::jit::drop(s, k);
    tl_loops.push_back(std::move(values));
    tl_run.loops = tl_loops.size();
  };
}

void loop_exit(Stack&) {
  if (!tl_loops.empty()) tl_loops.pop_back();
  tl_run.loops = tl_loops.size();
}

constexpr size_t kMaxValueDepth = 256;
const std::string kDepthText =
    std::string(kDepthError) + " " + std::to_string(kMaxValueDepth) + " levels are not allowed";

// The values a value holds directly.
void children(const c10::IValue& v, std::vector<c10::IValue>& out) {
  if (v.isTuple()) {
    for (const auto& e : v.toTupleRef().elements()) out.push_back(e);
  } else if (v.isList()) {
    for (const auto& e : v.toListRef()) out.push_back(e);
  } else if (v.isGenericDict()) {
    for (const auto& e : v.toGenericDict()) {
      out.push_back(e.key());
      out.push_back(e.value());
    }
  } else if (v.isObject()) {
    for (const auto& slot : v.toObjectRef().slots()) out.push_back(slot);
  }
}

// redisai::check_store(Any value, Any? container): refuses to store `value` in `container` if that would make
// a value deeper than kMaxValueDepth levels or one that contains itself. Longest path through the values it
// holds, each shared value once (iterative).
void check_store(Stack& s) {
  c10::IValue container = torch::jit::pop(s);
  c10::IValue value = torch::jit::pop(s);
  const void* target = container.isPtrType() ? container.internalToPointer() : nullptr;
  struct Frame {
    c10::IValue v;
    std::vector<c10::IValue> kids;
    size_t next = 0;
    size_t depth = 0;
  };
  std::unordered_map<const void*, size_t> depth_of;
  std::unordered_set<const void*> on_path;
  std::vector<Frame> path;
  auto enter = [&](const c10::IValue& v) {
    Frame f{v};
    children(v, f.kids);
    if (v.isPtrType()) on_path.insert(v.internalToPointer());
    path.push_back(std::move(f));
    if (path.size() + 1 > kMaxValueDepth) value_bound(kDepthText);
  };
  if (value.isPtrType() && value.internalToPointer() == target) value_bound(kCycleError);
  enter(value);
  while (!path.empty()) {
    Frame& f = path.back();
    if (f.next < f.kids.size()) {
      const c10::IValue& c = f.kids[f.next++];
      if (!c.isPtrType()) continue;
      const void* p = c.internalToPointer();
      if (p == target || on_path.count(p)) value_bound(kCycleError);
      auto known = depth_of.find(p);
      if (known != depth_of.end()) {
        f.depth = std::max(f.depth, known->second + 1);
        continue;
      }
      enter(c);
      continue;
    }
    const size_t d = f.depth;
    if (f.v.isPtrType()) {
      depth_of[f.v.internalToPointer()] = d;
      on_path.erase(f.v.internalToPointer());
    }
    path.pop_back();
    if (!path.empty()) path.back().depth = std::max(path.back().depth, d + 1);
    if (d + 1 >= kMaxValueDepth) value_bound(kDepthText);
  }
}

torch::jit::RegisterOperators g_ops({
    torch::jit::Operator("redisai::check_deadline(...) -> ()", check_deadline_op,
                         c10::AliasAnalysisKind::CONSERVATIVE),
    torch::jit::Operator("redisai::loop_enter(...) -> ()", loop_enter_op, c10::AliasAnalysisKind::CONSERVATIVE),
    torch::jit::Operator("redisai::loop_exit() -> ()", loop_exit, c10::AliasAnalysisKind::CONSERVATIVE),
    torch::jit::Operator("redisai::check_store(Any value, Any? container) -> ()", check_store,
                         c10::AliasAnalysisKind::CONSERVATIVE),
});

struct SilentWarnings : c10::WarningHandler {
  void process(const c10::Warning&) override {}
};
SilentWarnings g_silent;

}  // namespace

void install_allocator(uint64_t memory_bound) {
  g_limit.store(memory_bound, std::memory_order_relaxed);
  c10::SetCPUAllocator(&g_allocator, /*priority=*/UINT8_MAX);
}

}  // namespace detail

// ---- public -------------------------------------------------------------------------------------------------

using namespace detail;

uint64_t live_bytes() { return g_live.load(std::memory_order_relaxed); }

void next_block_written(uint64_t n) { tl_written = n; }

RunScope::RunScope(uint64_t timeout_ms)
    : saved_deadline_(tl_run.deadline_ns),
      saved_timeout_(tl_run.timeout_ms),
      saved_next_state_(tl_run.next_state_ns),
      saved_loops_(tl_loops.size()),
      saved_id_(tl_run.id),
      saved_handler_(c10::WarningUtils::get_warning_handler()) {
  if (tl_depth++ == 0) tl_stop = {0, ""};
  tl_run.id = g_run_ids.fetch_add(1, std::memory_order_relaxed) + 1;
  if (timeout_ms) {
    const int64_t deadline = now_ns() + static_cast<int64_t>(std::min<uint64_t>(timeout_ms, 1ULL << 40) * 1000000);
    if (!tl_run.deadline_ns || deadline < tl_run.deadline_ns) {
      tl_run.deadline_ns = deadline;
      tl_run.timeout_ms = timeout_ms;
    }
  }
  if (saved_deadline_ == 0) tl_run.next_state_ns = 0;
  c10::WarningUtils::set_warning_handler(&g_silent);
}

RunScope::~RunScope() {
  --tl_depth;
  tl_reuse.release(tl_run.id);
  tl_run.id = saved_id_;
  tl_run.deadline_ns = saved_deadline_;
  tl_run.timeout_ms = saved_timeout_;
  tl_run.next_state_ns = saved_next_state_;
  if (tl_loops.size() > saved_loops_) tl_loops.resize(saved_loops_);
  tl_run.loops = tl_loops.size();
  c10::WarningUtils::set_warning_handler(static_cast<c10::WarningHandler*>(saved_handler_));
}

namespace {

struct CompileJob {
  const std::function<void()>* fn;
  std::exception_ptr thrown;
  Failure stop;  // the compile thread's tl_stop, for failure() on the caller's thread
};

void* compile_thread(void* arg) {
  auto* job = static_cast<CompileJob*>(arg);
  try {
    (*job->fn)();
  } catch (...) {
    job->thrown = std::current_exception();
    job->stop = tl_stop;
  }
  return nullptr;
}

}  // namespace

void on_compile_stack(const std::function<void()>& fn) {
  pthread_attr_t attr;
  if (pthread_attr_init(&attr) != 0) throw std::runtime_error("TORCH: could not start the compile thread");
  CompileJob job{&fn, nullptr, {0, ""}};
  pthread_t thread;
  int rc = pthread_attr_setstacksize(&attr, kCompileStack);
  if (rc == 0) rc = pthread_create(&thread, &attr, &compile_thread, &job);
  pthread_attr_destroy(&attr);
  if (rc != 0) throw std::runtime_error("TORCH: could not start the compile thread (" + std::to_string(rc) + ")");
  pthread_join(thread, nullptr);
  if (job.thrown) {
    tl_stop = job.stop;
    std::rethrow_exception(job.thrown);
  }
}

QuietScope::QuietScope() : saved_handler_(c10::WarningUtils::get_warning_handler()) {
  c10::WarningUtils::set_warning_handler(&g_silent);
}

QuietScope::~QuietScope() {
  c10::WarningUtils::set_warning_handler(static_cast<c10::WarningHandler*>(saved_handler_));
}

Failure failure(const std::exception* e) {
  if (e && dynamic_cast<const detail::Refused*>(e)) return {kRefusedCode, e->what()};
  if (tl_stop.code) {
    Failure f = tl_stop;
    if (tl_depth == 0) tl_stop = {0, ""};  // inside a run, the runs around it fail with the same stop
    return f;
  }
  if (!e) return {kFailedCode, "TORCH: the backend failed with an unknown C++ exception"};
  const auto* ce = dynamic_cast<const c10::Error*>(e);
  return {kFailedCode, ce ? ce->what_without_backtrace() : e->what()};
}

}  // namespace rai

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

#include "sandbox.h"

#include <ATen/Context.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>
#include <caffe2/serialize/in_memory_adapter.h>
#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/api/function_impl.h>
#include <torch/csrc/jit/frontend/parser.h>
#include <torch/csrc/jit/frontend/tree_views.h>
#include <torch/csrc/jit/ir/ir.h>
#include <torch/csrc/jit/passes/inliner.h>
#include <torch/csrc/jit/runtime/custom_operator.h>
#include <torch/csrc/jit/runtime/operator.h>
#include <torch/csrc/jit/runtime/print_handler.h>
#include <torch/csrc/jit/serialization/import_read.h>
#include <torch/csrc/jit/serialization/import_source.h>

#include <algorithm>
#include <atomic>
#include <ctime>
#include <cstdio>
#include <cstring>
#include <functional>
#include <mutex>
#include <stdexcept>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace rai {
namespace {

using torch::jit::Block;
using torch::jit::Graph;
using torch::jit::Node;
using torch::jit::Stack;
using torch::jit::Value;

// ---- refusals -----------------------------------------------------------------------------------------------

struct Refused : std::runtime_error {
  using std::runtime_error::runtime_error;
};

bool starts_with(const std::string& s, const std::string& p) { return s.compare(0, p.size(), p) == 0; }
bool ends_with(const std::string& s, const std::string& p) {
  return s.size() >= p.size() && s.compare(s.size() - p.size(), p.size(), p) == 0;
}

// Operators refused inside the allowed namespaces, by `ns::name` (every overload) or `ns::name.overload`
// (`ns::name.` for the overload without a name).
const std::unordered_map<std::string, const char*>& denied_ops() {
  static const char* kSparse =
      "builds or exposes sparse-tensor internals without checking the indices (out-of-bounds memory access)";
  static const char* kNested = "builds a nested tensor over raw offsets without bounds checks";
  static const std::unordered_map<std::string, const char*> m = {
      // files
      {"aten::from_file", "reads files"},
      {"aten::save", "writes files"},
      // threads, deferred work, processes, network
      {"prim::fork", "runs code on another thread, outside the run's deadline"},
      {"aten::wait", "waits on code run on another thread"},
      {"prim::awaitable", "defers code outside the run"},
      {"prim::awaitable_wait", "defers code outside the run"},
      {"prim::awaitable_nowait", "defers code outside the run"},
      {"prim::rpc_async", "makes remote calls (RPC)"},
      {"prim::rpc_sync", "makes remote calls (RPC)"},
      {"prim::rpc_remote", "makes remote calls (RPC)"},
      {"aten::get_gradients", "reads distributed autograd state"},
      {"prim::PythonOp", "calls Python"},
      {"prim::IgnoredPythonOp", "calls Python"},
      // memory addresses
      {"prim::id", "returns a memory address"},
      {"mkldnn::data_ptr", "returns a memory address"},
      // output
      {"aten::_print", "writes to the server's standard output"},
      // process-wide state
      {"aten::manual_seed.", "reseeds the process-wide random generator"},
      {"aten::_cufft_set_plan_cache_max_size", "changes process-wide CUDA state"},
      {"aten::_cufft_clear_plan_cache", "changes process-wide CUDA state"},
      // memory safety: storages, unchecked indexing, sparse and nested internals
      {"aten::set_.source_Storage", "replaces a tensor's storage"},
      {"aten::set_.source_Storage_storage_offset", "replaces a tensor's storage"},
      {"aten::set.source_Storage", "replaces a tensor's storage"},
      {"aten::set.source_Storage_out", "replaces a tensor's storage"},
      {"aten::set.source_Storage_storage_offset", "replaces a tensor's storage"},
      {"aten::set.source_Storage_storage_offset_out", "replaces a tensor's storage"},
      {"aten::set_data", "replaces a tensor's storage"},
      {"aten::_reshape_alias", "makes a view with any strides (internal to functionalization)"},
      {"aten::_unsafe_index", "indexes without bounds checks"},
      {"aten::_unsafe_index_put", "indexes without bounds checks"},
      {"aten::_unsafe_masked_index", "indexes without bounds checks"},
      {"aten::_unsafe_masked_index_put_accumulate", "indexes without bounds checks"},
      {"aten::sparse_coo_tensor", kSparse},
      {"aten::_sparse_coo_tensor_unsafe", kSparse},
      {"aten::_sparse_coo_tensor_with_dims", kSparse},
      {"aten::_sparse_coo_tensor_with_dims_and_tensors", kSparse},
      {"aten::sparse_compressed_tensor", kSparse},
      {"aten::sparse_csr_tensor", kSparse},
      {"aten::sparse_csc_tensor", kSparse},
      {"aten::sparse_bsr_tensor", kSparse},
      {"aten::sparse_bsc_tensor", kSparse},
      {"aten::_sparse_compressed_tensor_unsafe", kSparse},
      {"aten::_sparse_compressed_tensor_with_dims", kSparse},
      {"aten::_sparse_csr_tensor_unsafe", kSparse},
      {"aten::_sparse_csc_tensor_unsafe", kSparse},
      {"aten::_sparse_bsr_tensor_unsafe", kSparse},
      {"aten::_sparse_bsc_tensor_unsafe", kSparse},
      {"aten::sparse_resize", kSparse},
      {"aten::sparse_resize_", kSparse},
      {"aten::sparse_resize_and_clear", kSparse},
      {"aten::sparse_resize_and_clear_", kSparse},
      {"aten::_coalesced_", kSparse},
      {"aten::_coalesced", kSparse},
      {"aten::_indices", kSparse},
      {"aten::_values", kSparse},
      {"aten::indices", kSparse},
      {"aten::values.", kSparse},  // Tensor.values(); the dict overloads are fine
      {"aten::crow_indices", kSparse},
      {"aten::col_indices", kSparse},
      {"aten::ccol_indices", kSparse},
      {"aten::row_indices", kSparse},
      {"aten::copy_sparse_to_sparse", kSparse},
      {"aten::copy_sparse_to_sparse_", kSparse},
      {"aten::resize_as_sparse", kSparse},
      {"aten::resize_as_sparse_", kSparse},
      {"aten::_nested_view_from_buffer", kNested},
      {"aten::_nested_view_from_buffer_copy", kNested},
      {"aten::_nested_view_from_jagged", kNested},
      {"aten::_nested_view_from_jagged_copy", kNested},
      {"aten::_nested_from_padded", kNested},
      {"aten::_nested_from_padded_and_nested_example", kNested},
      {"aten::_nested_from_padded_tensor", kNested},
      {"aten::_nested_get_values", kNested},
  };
  return m;
}

// Why an op namespace is refused; nullptr when allowed.
const char* namespace_reason(const std::string& ns, const std::string& qual, bool script) {
  static const std::unordered_set<std::string> allowed = {
      "aten", "prim", "quantized", "_quantized", "quantization", "onednn", "mkldnn", "mkldnn_prepacked", "mkl",
      "redisai"};
  if (allowed.count(ns)) return nullptr;
  if (ns == "redis" || ns == "redisAI") {
    return script ? nullptr : "is only available to scripts (AI.SCRIPTSTORE), not to models";
  }
  // RecordFunction scopes (`with torch.autograd.profiler.record_function(...)`): no effect without a profiler,
  // which nothing here can start.
  if (qual == "profiler::_record_function_enter" || qual == "profiler::_record_function_enter_new" ||
      qual == "profiler::_record_function_exit") {
    return nullptr;
  }
  if (ns == "profiler") return "drives the profiler";
  if (ns == "c10d" || ns == "_c10d_functional" || ns == "_c10d_functional_autograd" || ns == "symm_mem" ||
      ns == "_dtensor" || ns == "dist_c10d" || ns == "dist_rpc" || ns == "dist_autograd" || ns == "rpc") {
    return "does distributed communication (process groups, network)";
  }
  if (ns == "inductor" || ns == "inductor_prims") {
    return "is internal to the inductor compiler (unchecked memory views)";
  }
  if (ns == "cuda") return "changes the process's CUDA streams or devices";
  if (ns == "sparse") return "runs sparse kernels that trust their index data";
  return "is outside the allowed op namespaces (aten, prim, quantized, mkldnn, onednn)";
}

const std::string kClassPrefix = "__torch__.torch.classes.";

// Custom (C++) classes a model may hold or call; everything else registered in torch.classes is refused.
const char* class_reason(const std::string& qualname) {
  static const std::unordered_set<std::string> allowed = {
      "quantized.LinearPackedParamsBase",     "quantized.Conv2dPackedParamsBase",
      "quantized.Conv3dPackedParamsBase",     "quantized.EmbeddingPackedParamsBase",
      "rnn.CellParamsBase",                   "mkldnn.ConvOpContext",
      "profiler._RecordFunction"};
  std::string name = starts_with(qualname, kClassPrefix) ? qualname.substr(kClassPrefix.size()) : qualname;
  if (allowed.count(name)) return nullptr;
  if (starts_with(name, "_nnapi.")) return "loads a shared library (NNAPI)";
  if (starts_with(name, "c10d.")) return "does distributed communication (process groups, network)";
  if (starts_with(name, "rpc.") || starts_with(name, "dist_rpc.")) return "makes remote calls (RPC)";
  if (starts_with(name, "profiling.")) return "drives the process-wide TorchScript profiler";
  if (starts_with(name, "sparse.")) return "holds sparse weights whose indices are not checked";
  if (starts_with(name, "cuda.")) return "changes the process's CUDA streams";
  return "is not an allowed class";
}

// Types whose printed form holds a memory address ("<__torch__.M object at 0x...>"). `Any` is not among them:
// redis.execute returns Any, and str() of its reply is how scripts read it (RedisAI's own examples).
bool shows_address(const c10::TypePtr& t, int depth = 0) {
  if (!t || depth > 32) return false;
  switch (t->kind()) {
    case c10::TypeKind::ClassType:
    case c10::TypeKind::InterfaceType:
    case c10::TypeKind::AnyClassType:
    case c10::TypeKind::CapsuleType:
    case c10::TypeKind::FutureType:
    case c10::TypeKind::AwaitType:
    case c10::TypeKind::RRefType:
    case c10::TypeKind::FunctionType:
    case c10::TypeKind::PyObjectType:
      return true;
    default:
      break;
  }
  for (const auto& c : t->containedTypes()) {
    if (shows_address(c, depth + 1)) return true;
  }
  return false;
}

const c10::Symbol kCheckDeadline = c10::Symbol::fromQualString("redisai::check_deadline");

// Walks compiled code and refuses what the policy forbids.
class Inspector {
 public:
  Inspector(bool script) : script_(script) {}

  void function(torch::jit::Function& fn) {
    auto* gf = torch::jit::tryToGraphFunction(fn);
    if (!gf) return;
    where_ = fn.qualname().qualifiedName();
    if (starts_with(where_, "__torch__.")) where_ = where_.substr(10);
    block(gf->graph()->block());
  }

  [[noreturn]] void refuse(const std::string& subject, const std::string& reason) const {
    throw Refused(std::string("TORCH ") + (script_ ? "script" : "model") + " refused: " + subject + " " + reason +
                  (where_.empty() ? "" : " (in " + where_ + ")"));
  }

  void type(const c10::TypePtr& t) {
    std::vector<const c10::Type*> path;
    type(t, path);
  }

  // Custom classes, and TorchScript classes that contain themselves: their objects could be chained without
  // bound (a linked list), and libtorch destroys and prints values recursively.
  void type(const c10::TypePtr& t, std::vector<const c10::Type*>& path) {
    if (!t || path.size() > 256) return;
    if (auto ct = t->cast<c10::ClassType>()) {
      std::string name = ct->name() ? ct->name()->qualifiedName() : "";
      if (starts_with(name, kClassPrefix)) {
        if (const char* why = class_reason(name)) refuse("class " + name.substr(10), why);
        return;
      }
      if (std::find(path.begin(), path.end(), ct.get()) != path.end()) {
        refuse("class " + name.substr(starts_with(name, "__torch__.") ? 10 : 0),
               "contains itself (data of unbounded depth, which libtorch destroys recursively)");
      }
      if (seen_.count(ct.get())) return;
      path.push_back(ct.get());
      for (size_t i = 0; i < ct->numAttributes(); ++i) type(ct->getAttribute(i), path);
      path.pop_back();
      seen_.insert(ct.get());
      return;
    }
    for (const auto& c : t->containedTypes()) type(c, path);
  }

  void block(Block* b) {
    for (auto* v : b->inputs()) type(v->type());
    for (Node* n : b->nodes()) {
      node(n);
      for (auto* v : n->outputs()) type(v->type());
      for (Block* sb : n->blocks()) block(sb);
      for (auto a : n->attributeNames()) {
        if (n->kindOf(a) == torch::jit::AttributeKind::g) {
          block(n->g(a)->block());
        } else if (n->kindOf(a) == torch::jit::AttributeKind::gs) {
          for (const auto& g : n->gs(a)) block(g->block());
        }
      }
    }
  }

 private:
  void node(Node* n) {
    const c10::Symbol k = n->kind();
    const std::string qual = k.toQualString();
    const std::string ns = k.ns().toUnqualString();
    if (const char* why = namespace_reason(ns, qual, script_)) refuse(qual, why);
    const auto& denied = denied_ops();
    auto it = denied.find(qual);
    if (it == denied.end() && n->maybeSchema()) it = denied.find(qual + "." + n->maybeSchema()->overload_name());
    if (it != denied.end()) refuse(qual, it->second);
    static const std::unordered_set<std::string> formatting = {"prim::Print", "aten::str", "aten::format",
                                                               "aten::percentFormat", "aten::warn",
                                                               "aten::hash"};
    if (formatting.count(qual)) {
      for (auto* v : n->inputs()) {
        if (shows_address(v->type())) {
          refuse(qual, "formats an object of type " + v->type()->repr_str() + ", whose text holds a memory address");
        }
      }
    }
  }

  bool script_;
  std::string where_;
  std::unordered_set<const c10::Type*> seen_;
};

// Every function of `cu`, compiled (compiling may import more functions; repeat until none is new).
std::vector<torch::jit::Function*> all_functions(const torch::jit::CompilationUnit& cu) {
  size_t done = 0;
  for (int round = 0; round < 1000; ++round) {
    auto fns = cu.get_functions();
    if (fns.size() == done) return fns;
    for (size_t i = done; i < fns.size(); ++i) {
      if (auto* gf = torch::jit::tryToGraphFunction(*fns[i])) gf->graph();
    }
    done = fns.size();
  }
  throw Refused("TORCH model refused: its code keeps importing functions");
}

const c10::Symbol kCheckStore = c10::Symbol::fromQualString("redisai::check_store");

// Types that hide what a value holds (`Any`, interfaces): only through them can code nest a value in itself
// level after level (`y: Any = x; x = [y]`), which libtorch would later destroy, print or compare recursively
// until the stack overflows.
bool erased(const c10::TypePtr& t, int depth = 0) {
  if (!t || depth > 64) return false;
  switch (t->kind()) {
    case c10::TypeKind::AnyType:
    case c10::TypeKind::AnyListType:
    case c10::TypeKind::AnyTupleType:
    case c10::TypeKind::AnyClassType:
    case c10::TypeKind::InterfaceType:
      return true;
    default:
      break;
  }
  for (const auto& c : t->containedTypes()) {
    if (erased(c, depth + 1)) return true;
  }
  return false;
}

// Where a node stores a value in a container or object: (index of the stored input, index of the container
// input or -1 for a new container; -2: every input is stored in a new container).
bool store_of(Node* n, int* value, int* target) {
  const std::string k = n->kind().toQualString();
  if (k == "prim::ListConstruct" || k == "prim::DictConstruct" || k == "prim::TupleConstruct") {
    *value = -2;
    *target = -1;
  } else if (k == "prim::SetAttr" || k == "aten::append" || k == "aten::extend" || k == "aten::add_" ||
             k == "aten::update") {
    *value = 1;
    *target = 0;
  } else if (k == "aten::insert" || k == "aten::_set_item" || k == "aten::setdefault") {
    *value = 2;
    *target = 0;
  } else {
    return false;
  }
  return true;
}

// redisai::check_store(value, container) before each store of a value of erased type.
void guard_stores(Node* n) {
  int value, target;
  if (!store_of(n, &value, &target)) return;
  Graph* g = n->owningGraph();
  auto guard = [&](Value* v) {
    if (!erased(v->type())) return;
    torch::jit::WithInsertPoint at(n);
    Value* container = target >= 0 && static_cast<size_t>(target) < n->inputs().size()
                           ? n->input(target)
                           : g->insertConstant(c10::IValue());
    g->create(kCheckStore, std::vector<Value*>{v, container}, 0)->insertBefore(n);
  };
  if (value == -2) {
    for (Value* v : n->inputs()) guard(v);
  } else if (static_cast<size_t>(value) < n->inputs().size()) {
    guard(n->input(value));
  }
}

// Types whose values hold memory outside tensors: strings, containers, objects (what a loop can grow).
bool holds_memory(const c10::TypePtr& t, int depth = 0) {
  if (!t || depth > 64) return false;
  switch (t->kind()) {
    case c10::TypeKind::StringType:
    case c10::TypeKind::ListType:
    case c10::TypeKind::DictType:
    case c10::TypeKind::ClassType:
    case c10::TypeKind::AnyType:
    case c10::TypeKind::AnyListType:
    case c10::TypeKind::AnyTupleType:
    case c10::TypeKind::AnyClassType:
    case c10::TypeKind::InterfaceType:
      return true;
    default:
      break;
  }
  for (const auto& c : t->containedTypes()) {
    if (holds_memory(c, depth + 1)) return true;
  }
  return false;
}

bool within(const Block* b, const Block* outer) {
  for (; b; b = b->owningNode() ? b->owningNode()->owningBlock() : nullptr) {
    if (b == outer) return true;
  }
  return false;
}

// The values defined outside `body` that `b` (inside it) uses and that hold memory outside tensors.
void used_from_outside(const Block* body, Block* b, std::vector<Value*>& out, std::unordered_set<Value*>& seen) {
  auto use = [&](Value* v) {
    if (!within(v->node()->owningBlock(), body) && holds_memory(v->type()) && seen.insert(v).second) {
      out.push_back(v);
    }
  };
  for (Node* n : b->nodes()) {
    for (Value* v : n->inputs()) use(v);
    for (Block* sb : n->blocks()) used_from_outside(body, sb, out, seen);
  }
  for (Value* v : b->outputs()) use(v);
}

const c10::Symbol kLoopEnter = c10::Symbol::fromQualString("redisai::loop_enter");
const c10::Symbol kLoopExit = c10::Symbol::fromQualString("redisai::loop_exit");

// redisai::check_deadline(<carried state>) at the start of every loop body, in every block and subgraph, and
// redisai::check_store() before every store of an erased value. A loop's state is every value it can reach
// that holds memory outside tensors: what it carries from one iteration to the next (passed to each check) and
// what it uses from outside, such as a list it appends to (registered by redisai::loop_enter before the loop,
// dropped by redisai::loop_exit after it). Whatever a run keeps across iterations is reachable from these.
void instrument(Block* b) {
  for (Node* n : b->nodes()) {
    if (n->kind() != kCheckStore) guard_stores(n);
    for (Block* sb : n->blocks()) instrument(sb);
    for (auto a : n->attributeNames()) {
      if (n->kindOf(a) == torch::jit::AttributeKind::g) {
        instrument(n->g(a)->block());
      } else if (n->kindOf(a) == torch::jit::AttributeKind::gs) {
        for (const auto& g : n->gs(a)) instrument(g->block());
      }
    }
    if (n->kind() == c10::prim::Loop && !n->blocks().empty()) {
      Block* body = n->blocks()[0];
      Node* first = body->nodes().front();
      if (first->kind() != kCheckDeadline) {
        Graph* g = body->owningGraph();
        std::vector<Value*> carried, outer;
        std::unordered_set<Value*> seen;
        for (size_t i = 1; i < body->inputs().size(); ++i) {  // input 0 is the iteration count
          if (holds_memory(body->inputs()[i]->type()) && seen.insert(body->inputs()[i]).second) {
            carried.push_back(body->inputs()[i]);
          }
        }
        used_from_outside(body, body, outer, seen);
        body->prependNode(g->create(kCheckDeadline, carried, 0));
        // What the loop uses from outside is the same object in every iteration: registered once around it,
        // not passed to every check (each input costs the iteration a reference count up and down).
        if (!outer.empty()) {
          g->create(kLoopEnter, outer, 0)->insertBefore(n);
          g->create(kLoopExit, 0)->insertAfter(n);
        }
      }
    }
  }
}

void admit(const torch::jit::CompilationUnit& cu, bool script) {
  Inspector ins(script);
  auto fns = all_functions(cu);
  for (auto* fn : fns) ins.function(*fn);
  for (auto* fn : fns) {
    if (auto* gf = torch::jit::tryToGraphFunction(*fn)) instrument(gf->graph()->block());
  }
}

// ---- the counting CPU allocator -----------------------------------------------------------------------------

constexpr size_t kHeader = 64;  // keeps alloc_cpu's 64-byte alignment; the first 8 bytes hold the size
std::atomic<uint64_t> g_live{0};
std::atomic<uint64_t> g_limit{0};
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
};
thread_local RunLimits tl_run;
// What the loops running on this thread use from outside themselves (redisai::loop_enter), innermost last.
thread_local std::vector<std::vector<c10::IValue>> tl_loops;

[[noreturn]] void timed_out() {
  TORCH_CHECK(false, kTimeoutError, " (", tl_run.timeout_ms, " ms)");
  throw std::logic_error("unreachable");
}

[[noreturn]] void over_memory(uint64_t asked) {
  TORCH_CHECK_WITH(OutOfMemoryError, false, kMemoryError, " (", asked, " bytes asked, ",
                   g_live.load(std::memory_order_relaxed), " held, bound ", g_limit.load(std::memory_order_relaxed),
                   ")");
  throw std::logic_error("unreachable");
}

void counted_free(void* p) {
  if (!p) return;
  char* base = static_cast<char*>(p) - kHeader;
  uint64_t n;
  std::memcpy(&n, base, sizeof n);
  g_live.fetch_sub(n, std::memory_order_relaxed);
  c10::free_cpu(base);
}

// The size a block of ours was allocated with; false if `dp` is not ours.
bool counted_size(const c10::DataPtr& dp, uint64_t* n) {
  if (dp.get_deleter() != &counted_free || !dp.get()) return false;
  std::memcpy(n, static_cast<const char*>(dp.get()) - kHeader, sizeof *n);
  return true;
}

struct CountingAllocator final : c10::Allocator {
  c10::DataPtr allocate(size_t n) override {
    if (tl_run.deadline_ns && now_ns() > tl_run.deadline_ns) timed_out();
    const uint64_t limit = g_limit.load(std::memory_order_relaxed);
    if (n > SIZE_MAX / 2) over_memory(n);
    const uint64_t after = g_live.fetch_add(n, std::memory_order_relaxed) + n;
    if (limit && after > limit) {
      g_live.fetch_sub(n, std::memory_order_relaxed);
      over_memory(n);
    }
    void* base = nullptr;
    try {
      base = c10::alloc_cpu(n + kHeader);
    } catch (...) {
      g_live.fetch_sub(n, std::memory_order_relaxed);
      throw;
    }
    const uint64_t size = n;
    std::memcpy(base, &size, sizeof size);
    void* p = static_cast<char*>(base) + kHeader;
    // Zeroed before libtorch can read it: torch.empty, new_empty, resize_, out= and the like return memory they
    // have not written, and whatever it held (another client's tensors, strings, replies) would go to this
    // client. Zeroing here rather than scrubbing on free also covers memory that malloc got from elsewhere in
    // the process (the module's, other backends', Redis's when it shares the malloc), and it happens on the
    // thread of the run that asked. Cost: one write pass over each new block (docs/security.md).
    std::memset(p, 0, n);
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

uint64_t add_sat(uint64_t a, uint64_t b) { return a + b < a ? UINT64_MAX : a + b; }

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
    TORCH_CHECK(path.size() + 1 <= kMaxValueDepth, kDepthError, " ", kMaxValueDepth, " levels are not allowed");
  };
  if (value.isPtrType() && value.internalToPointer() == target) TORCH_CHECK(false, kCycleError);
  enter(value);
  while (!path.empty()) {
    Frame& f = path.back();
    if (f.next < f.kids.size()) {
      const c10::IValue& c = f.kids[f.next++];
      if (!c.isPtrType()) continue;
      const void* p = c.internalToPointer();
      TORCH_CHECK(p != target && !on_path.count(p), kCycleError);
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
    TORCH_CHECK(d + 1 < kMaxValueDepth, kDepthError, " ", kMaxValueDepth, " levels are not allowed");
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

// ---- bounded string and list ops ----------------------------------------------------------------------------

uint64_t mul_sat(uint64_t a, uint64_t b) {
  uint64_t r;
  return __builtin_mul_overflow(a, b, &r) ? UINT64_MAX : r;
}
uint64_t nonneg(int64_t v) { return v < 0 ? 0 : static_cast<uint64_t>(v); }

constexpr uint64_t kListItem = 16;    // an IValue in a list
constexpr uint64_t kStringItem = 64;  // a one-character string in a list (IValue + string object)

// The i-th of `n` arguments on the stack.
const c10::IValue& arg(const Stack& s, size_t n, size_t i) { return s[s.size() - n + i]; }

using Estimate = std::function<uint64_t(const Stack&, size_t)>;

// Registers `wrapped` in place of `op` (same schema and alias analysis). Compile-time constant folding calls the
// same operator, so a wrapper also holds at AI.SCRIPTSTORE.
void replace_op(const std::shared_ptr<torch::jit::Operator>& op, torch::jit::Operation wrapped) {
  const c10::FunctionSchema schema = op->schema();
  const auto kind = op->aliasAnalysisKind();
  torch::jit::deregisterOperator(schema);
  if (schema.is_vararg()) {
    torch::jit::registerOperator(torch::jit::Operator(c10::toString(schema), std::move(wrapped), kind));
  } else {
    torch::jit::registerOperator(torch::jit::Operator(schema.name(), schema.overload_name(), schema.arguments(),
                                                      schema.returns(), std::move(wrapped), kind));
  }
}

// Replaces `qual`.`overload` by a version that first estimates the bytes its result takes and refuses past the
// bound.
void bound_op(const char* qual, const char* overload, Estimate estimate) {
  std::shared_ptr<torch::jit::Operator> op;
  for (const auto& o : torch::jit::getAllOperatorsFor(c10::Symbol::fromQualString(qual))) {
    if (o->schema().overload_name() == overload) op = o;
  }
  if (!op) return;
  const size_t nargs = op->schema().arguments().size();
  torch::jit::Operation inner = op->getOperation();
  replace_op(op, [inner, estimate, nargs](Stack& s) mutable {
    const uint64_t limit = g_limit.load(std::memory_order_relaxed);
    if (limit && s.size() >= nargs) {
      const uint64_t bytes = estimate(s, nargs);
      if (bytes > limit) over_memory(bytes);
    }
    inner(s);
  });
}

uint64_t str_len(const c10::IValue& v) { return v.isString() ? v.toStringRef().size() : 0; }
uint64_t list_len(const c10::IValue& v) { return v.isList() ? v.toListRef().size() : 0; }

void bound_ops() {
  auto width = [](const Stack& s, size_t n) { return add_sat(str_len(arg(s, n, 0)), nonneg(arg(s, n, 1).toInt())); };
  for (const char* q : {"aten::ljust", "aten::rjust", "aten::center", "aten::zfill"}) bound_op(q, "", width);
  bound_op("aten::expandtabs", "", [](const Stack& s, size_t n) {
    return mul_sat(str_len(arg(s, n, 0)), std::max<uint64_t>(nonneg(arg(s, n, 1).toInt()), 1));
  });
  bound_op("aten::replace", "", [](const Stack& s, size_t n) {
    const uint64_t len = str_len(arg(s, n, 0)), old = str_len(arg(s, n, 1)), neu = str_len(arg(s, n, 2));
    const uint64_t occurrences = old ? len / old : len + 1;
    return add_sat(len, mul_sat(occurrences, neu));
  });
  bound_op("aten::join", "", [](const Stack& s, size_t n) {
    uint64_t total = 0, count = 0;
    const auto& v = arg(s, n, 1);
    if (v.isList()) {
      for (const auto& e : v.toListRef()) {
        total = add_sat(total, str_len(e));
        ++count;
      }
    }
    return add_sat(total, mul_sat(count, str_len(arg(s, n, 0))));
  });
  bound_op("aten::add", "str",
           [](const Stack& s, size_t n) { return add_sat(str_len(arg(s, n, 0)), str_len(arg(s, n, 1))); });
  auto two_lists = [](const Stack& s, size_t n) {
    return mul_sat(add_sat(list_len(arg(s, n, 0)), list_len(arg(s, n, 1))), kListItem);
  };
  bound_op("aten::add", "t", two_lists);
  bound_op("aten::extend", "t", two_lists);
  auto repeat_left = [](const Stack& s, size_t n) {
    return mul_sat(mul_sat(list_len(arg(s, n, 0)), nonneg(arg(s, n, 1).toInt())), kListItem);
  };
  bound_op("aten::mul", "left_t", repeat_left);
  bound_op("aten::mul_", "t", repeat_left);
  bound_op("aten::mul", "right_", [](const Stack& s, size_t n) {
    return mul_sat(mul_sat(list_len(arg(s, n, 1)), nonneg(arg(s, n, 0).toInt())), kListItem);
  });
  auto per_char = [](const Stack& s, size_t n) { return mul_sat(str_len(arg(s, n, 0)), kStringItem); };
  bound_op("aten::list", "", per_char);
  bound_op("aten::split", "str", per_char);
  bound_op("aten::rsplit", "", per_char);
  bound_op("aten::splitlines", "", per_char);
  bound_op("aten::add_", "t", two_lists);
  // Views that describe more elements than their storage holds (expand, as_strided, ...): a reduction over
  // `torch.zeros(1).expand(10**9, 10**9)` is one kernel of 10**18 steps, which nothing could interrupt. A view
  // may not describe more bytes than the bound.
  auto sizes_of = [](const c10::IValue& v) { return v.isIntList() ? v.toIntVector() : std::vector<int64_t>{}; };
  auto elem = [](const c10::IValue& t) -> uint64_t {
    return t.isTensor() ? static_cast<uint64_t>(t.toTensor().element_size()) : 1;
  };
  auto expanded = [sizes_of, elem](const Stack& s, size_t n) {
    const auto& self = arg(s, n, 0);
    const auto size = sizes_of(arg(s, n, 1));
    if (!self.isTensor()) return uint64_t{0};
    const auto& t = self.toTensor();
    uint64_t numel = 1;
    const int64_t lead = static_cast<int64_t>(size.size()) - t.dim();
    for (int64_t i = 0; i < static_cast<int64_t>(size.size()); ++i) {
      int64_t d = size[i];
      if (d < 0 && i - lead >= 0) d = t.size(i - lead);
      numel = mul_sat(numel, nonneg(d));
    }
    return mul_sat(numel, elem(self));
  };
  bound_op("aten::expand", "", expanded);
  bound_op("aten::broadcast_to", "", expanded);
  bound_op("aten::expand_as", "", [elem](const Stack& s, size_t n) {
    const auto& other = arg(s, n, 1);
    return other.isTensor() ? mul_sat(nonneg(other.toTensor().numel()), elem(arg(s, n, 0))) : 0;
  });
  auto strided = [sizes_of, elem](const Stack& s, size_t n) {
    uint64_t numel = 1;
    for (int64_t d : sizes_of(arg(s, n, 1))) numel = mul_sat(numel, nonneg(d));
    return mul_sat(numel, elem(arg(s, n, 0)));
  };
  bound_op("aten::as_strided", "", strided);
  bound_op("aten::as_strided_", "", strided);
  bound_op("aten::unfold", "", [elem](const Stack& s, size_t n) -> uint64_t {
    const auto& self = arg(s, n, 0);
    if (!self.isTensor() || self.toTensor().dim() == 0) return 0;
    const auto& t = self.toTensor();
    const int64_t dim = c10::maybe_wrap_dim(arg(s, n, 1).toInt(), t.dim());
    const int64_t size = arg(s, n, 2).toInt(), step = std::max<int64_t>(arg(s, n, 3).toInt(), 1);
    const int64_t extent = t.size(dim);
    if (extent == 0) return 0;
    const uint64_t windows = size > extent ? 0 : nonneg((extent - size) / step + 1);
    return mul_sat(mul_sat(mul_sat(nonneg(t.numel() / extent), windows), nonneg(size)), elem(self));
  });
  // All tensors take the broadcast shape (views), or one each of the product of the sizes (meshgrid).
  auto tensors_of = [](const c10::IValue& v) {
    std::vector<at::Tensor> out;
    if (v.isTensorList()) out = v.toTensorVector();
    return out;
  };
  bound_op("aten::broadcast_tensors", "", [tensors_of](const Stack& s, size_t n) {
    const auto ts = tensors_of(arg(s, n, 0));
    std::vector<int64_t> shape;
    uint64_t widest = 1;
    for (const auto& t : ts) {
      widest = std::max<uint64_t>(widest, t.element_size());
      if (static_cast<size_t>(t.dim()) > shape.size()) shape.insert(shape.begin(), t.dim() - shape.size(), 1);
      for (int64_t i = 0; i < t.dim(); ++i) {
        int64_t& d = shape[shape.size() - t.dim() + i];
        d = std::max(d, t.size(i));
      }
    }
    uint64_t numel = 1;
    for (int64_t d : shape) numel = mul_sat(numel, nonneg(d));
    return mul_sat(mul_sat(numel, widest), ts.size());
  });
  auto grid = [tensors_of](const Stack& s, size_t n) {
    const auto ts = tensors_of(arg(s, n, 0));
    uint64_t numel = 1, widest = 1;
    for (const auto& t : ts) {
      numel = mul_sat(numel, nonneg(t.numel()));
      widest = std::max<uint64_t>(widest, t.element_size());
    }
    return mul_sat(mul_sat(numel, widest), ts.size());
  };
  bound_op("aten::meshgrid", "", grid);
  bound_op("aten::meshgrid", "indexing", grid);
  // prim::tolist(Tensor, int dim, int elem_type): every element becomes an IValue in a (nested) list.
  bound_op("prim::tolist", "", [](const Stack& s, size_t) -> uint64_t {
    if (s.size() < 3 || !s[s.size() - 3].isTensor()) return 0;
    return mul_sat(nonneg(s[s.size() - 3].toTensor().numel()), 2 * kListItem);
  });
}

// ---- memory that is not the counting allocator's -------------------------------------------------------------
// Tensors on a GPU (CUDA's caching allocator) and in pinned host memory (CUDA's host allocator) do not come from
// the counting allocator, so nothing zeroes them when they are handed out again. The ops that return memory they
// have not written zero it in their results instead: the empty family (a new tensor: all of it; an out=
// tensor: what its resize added), the in-place resizes (what they added to the storage) and the functional
// resizes (the elements past self's). Tensors of the counting allocator are already zero and are skipped.
// With the CPU-only libtorch, neither a GPU nor pinned memory exists (both fail with an error).

enum class Unwritten { kFresh, kGrown, kPastSelf };

bool zeroed_by_allocator(const at::Tensor& t) {
  if (!t.defined() || !t.has_storage()) return true;  // no storage (oneDNN's opaque tensors use the allocator)
  const auto& st = t.storage();
  uint64_t n;
  return st.nbytes() == 0 || !st.data() || counted_size(st.data_ptr(), &n);
}

// Zeroes the bytes of `st` from `from` on, on its device.
void zero_storage(const c10::Storage& st, uint64_t from) {
  const uint64_t n = st.nbytes();
  if (from >= n) return;
  at::Tensor bytes = at::empty({0}, at::TensorOptions().dtype(at::kByte).device(st.device()));
  bytes.set_(st, static_cast<int64_t>(from), {static_cast<int64_t>(n - from)}, {1});
  bytes.zero_();
}

void scrub_op(const std::shared_ptr<torch::jit::Operator>& op, Unwritten kind) {
  const c10::FunctionSchema& schema = op->schema();
  const size_t nargs = schema.arguments().size(), nret = schema.returns().size();
  std::vector<size_t> written;  // arguments the op writes to (self of resize_, out=)
  for (size_t i = 0; i < nargs; ++i) {
    const auto* alias = schema.arguments()[i].alias_info();
    if (alias && alias->isWrite()) written.push_back(i);
  }
  torch::jit::Operation inner = op->getOperation();
  replace_op(op, [inner, kind, nargs, nret, written](Stack& s) mutable {
    if (s.size() < nargs) return inner(s);
    // Before: the storages the op may grow, with their sizes, and self's elements.
    std::vector<std::pair<const c10::StorageImpl*, uint64_t>> before;
    for (size_t i : written) {
      const auto& a = arg(s, nargs, i);
      if (a.isTensor() && !zeroed_by_allocator(a.toTensor())) {
        const auto& st = a.toTensor().storage();
        before.emplace_back(st.unsafeGetStorageImpl(), st.nbytes());
      }
    }
    const auto& self = arg(s, nargs, 0);
    const int64_t self_numel = self.isTensor() && self.toTensor().defined() ? self.toTensor().numel() : 0;
    inner(s);
    if (s.size() < nret) return;
    for (size_t i = s.size() - nret; i < s.size(); ++i) {
      if (!s[i].isTensor() || zeroed_by_allocator(s[i].toTensor())) continue;
      const at::Tensor& r = s[i].toTensor();
      if (kind == Unwritten::kPastSelf) {
        if (r.numel() <= self_numel) continue;
        TORCH_CHECK(r.is_contiguous(), "TORCH: resizing to a non-contiguous layout is only supported on the CPU");
        r.view({-1}).narrow(0, self_numel, r.numel() - self_numel).zero_();
        continue;
      }
      uint64_t from = 0;  // a storage the op grew keeps what it held; a new one is zeroed from the start
      for (const auto& [impl, nbytes] : before) {
        if (impl == r.storage().unsafeGetStorageImpl()) from = nbytes;
      }
      zero_storage(r.storage(), from);
    }
  });
}

void scrub_ops() {
  const std::pair<const char*, Unwritten> ops[] = {
      {"aten::empty", Unwritten::kFresh},
      {"aten::empty_like", Unwritten::kFresh},
      {"aten::empty_strided", Unwritten::kFresh},
      {"aten::empty_permuted", Unwritten::kFresh},
      {"aten::new_empty", Unwritten::kFresh},
      {"aten::new_empty_strided", Unwritten::kFresh},
      {"aten::empty_quantized", Unwritten::kFresh},
      {"aten::_empty_affine_quantized", Unwritten::kFresh},
      {"aten::_empty_per_channel_affine_quantized", Unwritten::kFresh},
      {"aten::resize_", Unwritten::kGrown},
      {"aten::resize_as_", Unwritten::kGrown},
      {"aten::_resize_output_", Unwritten::kGrown},
      {"aten::resize", Unwritten::kPastSelf},
      {"aten::resize_as", Unwritten::kPastSelf},
      {"aten::_resize_output", Unwritten::kPastSelf},
  };
  for (const auto& [qual, kind] : ops) {
    // A copy: replacing an operator changes the registry's list.
    const std::vector<std::shared_ptr<torch::jit::Operator>> overloads =
        torch::jit::getAllOperatorsFor(c10::Symbol::fromQualString(qual));
    for (const auto& op : overloads) scrub_op(op, kind);
  }
}

void silent_print(const std::string&) {}

struct SilentWarnings : c10::WarningHandler {
  void process(const c10::Warning&) override {}
};
SilentWarnings g_silent;

// ---- the archive, before torch::jit::load -------------------------------------------------------------------

constexpr size_t kMaxPickleDepth = 1000;  // nesting that destroying the values cannot overflow the stack with

[[noreturn]] void refuse_model(const std::string& why) { throw Refused("TORCH model refused: " + why); }

// Walks a pickle the way torch::jit::Unpickler does, without building anything: the classes it names, and
// the graph of containers it builds (depth and cycles: libtorch destroys values recursively).
void scan_pickle(const std::string& record, const uint8_t* p, size_t n) {
  std::vector<std::vector<uint32_t>> kids(1);  // node 0: a leaf
  std::vector<uint32_t> stack;
  std::vector<size_t> marks;
  std::unordered_map<uint64_t, uint32_t> memo;
  size_t i = 0;
  auto bad = [&](const char* why) { refuse_model("its pickle " + record + " is malformed (" + why + ")"); };
  auto need = [&](size_t k) {
    if (n - i < k) bad("truncated");
  };
  auto u32 = [&]() {
    need(4);
    uint32_t v;
    std::memcpy(&v, p + i, 4);
    i += 4;
    return v;
  };
  auto pop = [&]() {
    if (stack.empty()) bad("stack underflow");
    uint32_t v = stack.back();
    stack.pop_back();
    return v;
  };
  auto node = [&](std::vector<uint32_t> children) {
    kids.push_back(std::move(children));
    return static_cast<uint32_t>(kids.size() - 1);
  };
  auto since_mark = [&]() {
    if (marks.empty() || marks.back() > stack.size()) bad("mark");
    size_t m = marks.back();
    marks.pop_back();
    std::vector<uint32_t> items(stack.begin() + m, stack.end());
    stack.resize(m);
    return items;
  };
  auto line = [&]() {
    const void* nl = std::memchr(p + i, '\n', n - i);
    if (!nl) bad("unterminated name");
    std::string s(reinterpret_cast<const char*>(p + i), static_cast<const uint8_t*>(nl) - (p + i));
    i = static_cast<const uint8_t*>(nl) - p + 1;
    return s;
  };
  bool stopped = false;
  while (!stopped) {
    need(1);
    const uint8_t op = p[i++];
    switch (op) {
      case 0x80: need(1); ++i; break;  // PROTO
      case '.': stopped = true; break;  // STOP
      case '(': marks.push_back(stack.size()); break;
      case ']': case ')': case '}': stack.push_back(node({})); break;
      case 'q': need(1); if (stack.empty()) bad("put"); memo[p[i++]] = stack.back(); break;
      case 'r': { uint32_t k = u32(); if (stack.empty()) bad("put"); memo[k] = stack.back(); break; }
      case 'h': case 'j': {
        uint64_t k;
        if (op == 'h') { need(1); k = p[i++]; } else { k = u32(); }
        auto it = memo.find(k);
        if (it == memo.end()) bad("get");
        stack.push_back(it->second);
        break;
      }
      case 0x88: case 0x89: case 'N': stack.push_back(0); break;
      case 'K': need(1); i += 1; stack.push_back(0); break;
      case 'M': need(2); i += 2; stack.push_back(0); break;
      case 'J': need(4); i += 4; stack.push_back(0); break;
      case 0x8a: { need(1); size_t len = p[i++]; need(len); i += len; stack.push_back(0); break; }  // LONG1
      case 'X': { size_t len = u32(); need(len); i += len; stack.push_back(0); break; }  // BINUNICODE
      case 'G': need(8); i += 8; stack.push_back(0); break;
      case 't': case 'l': case 'd': stack.push_back(node(since_mark())); break;  // TUPLE LIST DICT
      case 0x85: case 0x86: case 0x87: {  // TUPLE1..3
        std::vector<uint32_t> items(op - 0x84);
        for (size_t k = items.size(); k-- > 0;) items[k] = pop();
        stack.push_back(node(std::move(items)));
        break;
      }
      case 'e': case 'u': {  // APPENDS SETITEMS
        if (marks.empty() || marks.back() == 0 || marks.back() > stack.size()) bad("mark");
        uint32_t container = stack[marks.back() - 1];
        auto items = since_mark();
        if (container == 0) bad("append to a scalar");
        kids[container].insert(kids[container].end(), items.begin(), items.end());
        break;
      }
      case 's': {  // SETITEM
        uint32_t v = pop(), k = pop();
        if (stack.empty() || stack.back() == 0) bad("setitem");
        kids[stack.back()].push_back(k);
        kids[stack.back()].push_back(v);
        break;
      }
      case 'c': {  // GLOBAL
        std::string module = line(), name = line();
        if (starts_with(module + ".", kClassPrefix)) {
          std::string qual = module + "." + name;
          if (const char* why = class_reason(qual)) {
            refuse_model("its data holds an object of class " + qual.substr(10) + ", which " + why);
          }
        } else if (module == "torch._utils" && starts_with(name, "_rebuild_sparse")) {
          refuse_model("its data holds a sparse tensor, whose indices are not checked");
        } else if (starts_with(module, "torch.distributed")) {
          refuse_model("its data holds a distributed object (" + module + "." + name + ")");
        }
        stack.push_back(0);
        break;
      }
      case 0x81: pop(); break;  // NEWOBJ
      case 'b': case 'R': {     // BUILD REDUCE
        uint32_t a = pop();
        pop();
        stack.push_back(node({a}));
        break;
      }
      case 'Q': pop(); stack.push_back(0); break;  // BINPERSID
      default:
        bad("unsupported opcode");
    }
  }
  // Longest path from any node, refusing cycles (iterative: the structure is what may be deep).
  std::vector<uint8_t> state(kids.size(), 0);  // 0 new, 1 on the path, 2 done
  std::vector<uint32_t> depth(kids.size(), 0);
  for (uint32_t root = 1; root < kids.size(); ++root) {
    if (state[root]) continue;
    std::vector<std::pair<uint32_t, size_t>> path = {{root, 0}};
    state[root] = 1;
    while (!path.empty()) {
      auto& [v, next] = path.back();
      if (next < kids[v].size()) {
        uint32_t c = kids[v][next++];
        if (c == 0) continue;
        if (state[c] == 1) refuse_model("its pickle " + record + " holds a value that contains itself");
        if (state[c] == 0) {
          state[c] = 1;
          path.push_back({c, 0});
        }
        continue;
      }
      uint32_t d = 0;
      for (uint32_t c : kids[v]) d = std::max(d, c ? depth[c] + 1 : 1);
      depth[v] = d;
      state[v] = 2;
      if (d > kMaxPickleDepth) {
        refuse_model("its pickle " + record + " nests values deeper than " + std::to_string(kMaxPickleDepth) +
                     " levels");
      }
      path.pop_back();
    }
  }
}

// A tensor read from the archive: dense, inside its storage, and its storage inside what was read.
void check_tensor(const at::Tensor& t, int depth = 0) {
  if (!t.defined()) return;
  if (t.layout() != c10::kStrided || t.is_nested()) refuse_model("it holds a sparse or nested tensor");
  const auto& st = t.storage();
  const uint64_t nbytes = st.nbytes();
  uint64_t real = 0;
  if (nbytes > 0 && (!counted_size(st.data_ptr(), &real) || real < nbytes)) {
    refuse_model("it holds a tensor whose storage is larger than its data in the archive");
  }
  if (t.numel() > 0) {
    if (t.storage_offset() < 0) refuse_model("it holds a tensor with a negative storage offset");
    unsigned __int128 last = static_cast<uint64_t>(t.storage_offset());
    for (int64_t d = 0; d < t.dim(); ++d) {
      if (t.size(d) < 0 || t.stride(d) < 0) refuse_model("it holds a tensor with negative sizes or strides");
      last += static_cast<unsigned __int128>(t.size(d) - 1) * static_cast<uint64_t>(t.stride(d));
    }
    if ((last + 1) * t.element_size() > nbytes) refuse_model("it holds a tensor that reaches past its storage");
  }
  if (t.is_quantized() && depth == 0 &&
      (t.qscheme() == at::kPerChannelAffine || t.qscheme() == at::kPerChannelAffineFloatQParams)) {
    check_tensor(t.q_per_channel_scales(), 1);
    check_tensor(t.q_per_channel_zero_points(), 1);
  }
}

// Every tensor reachable from the values given to `walk` (iterative; each shared value once per archive).
class TensorChecker {
 public:
  void walk(const c10::IValue& root) {
    std::vector<c10::IValue> todo = {root};
    while (!todo.empty()) {
      c10::IValue v = std::move(todo.back());
      todo.pop_back();
      if (v.isPtrType() && !seen_.insert(v.internalToPointer()).second) continue;
      if (v.isTensor()) {
        check_tensor(v.toTensor());
      } else if (v.isTuple()) {
        for (const auto& e : v.toTupleRef().elements()) todo.push_back(e);
      } else if (v.isList()) {
        for (const auto& e : v.toListRef()) todo.push_back(e);
      } else if (v.isGenericDict()) {
        for (const auto& e : v.toGenericDict()) {
          todo.push_back(e.key());
          todo.push_back(e.value());
        }
      } else if (v.isObject()) {
        for (const auto& slot : v.toObjectRef().slots()) todo.push_back(slot);
      }
    }
  }

 private:
  std::unordered_set<const void*> seen_;
};

// How deep TorchScript source can make the parser, the compiler and the trees they build recurse, estimated
// from its tokens (libtorch's lexer is iterative): open brackets, operator chains inside them (a + b + c is a
// tree as deep as the chain; commas start a new element), calls and attribute chains, indentation and elif
// chains (each counted twice: the compiler spends more stack on statements). 2,000 levels of parentheses or
// 1,000 elifs overflow a 2 MB thread (measured); the limit leaves a wide margin and no real code nears it.
constexpr int kMaxSourceDepth = 256;

void check_source_depth(const std::shared_ptr<torch::jit::Source>& src, bool script) {
  using namespace torch::jit;
  Lexer L(src);
  std::vector<int> chain = {0};
  int indent = 0, elifs = 0, sum = 0, prev = TK_NEWLINE;
  for (;;) {
    const int k = L.cur().kind;
    if (k == TK_EOF) break;
    switch (k) {
      case TK_NEWLINE:
        chain.assign(1, 0);
        sum = 0;
        break;
      case TK_INDENT: ++indent; break;
      case TK_DEDENT: --indent; break;
      case TK_DEF: elifs = 0; break;
      case TK_ELIF: ++elifs; break;
      case '(': case '[': case '{':
        if (prev == TK_IDENT || prev == ')' || prev == ']' || prev == '}' || prev == TK_STRINGLITERAL) {
          ++chain.back();
          ++sum;
        }
        chain.push_back(0);
        break;
      case ')': case ']': case '}':
        if (chain.size() > 1) {
          sum -= chain.back();
          chain.pop_back();
        }
        break;
      case ',': case ':': case '=':
        sum -= chain.back();
        chain.back() = 0;
        break;
      case TK_IDENT: case TK_NUMBER: case TK_STRINGLITERAL: case TK_TRUE: case TK_FALSE: case TK_NONE:
        break;
      default:  // operators, '.', and keywords inside expressions
        ++chain.back();
        ++sum;
    }
    const int depth = 2 * indent + 2 * elifs + sum + static_cast<int>(chain.size());
    if (depth > kMaxSourceDepth) {
      throw Refused(std::string("TORCH ") + (script ? "script" : "model") + " refused: its code nests deeper than " +
                    std::to_string(kMaxSourceDepth) + " levels (line " +
                    std::to_string(L.cur().range.source()->lineno_for_offset(L.cur().range.start()) + 1) + ")");
    }
    prev = k;
    L.next();
  }
}

// Names of the classes a code file defines, parsed as SourceImporter does.
std::vector<std::string> class_names(const std::shared_ptr<torch::jit::Source>& src) {
  std::vector<std::string> names;
  torch::jit::Parser parser(src);
  auto& L = parser.lexer();
  if (L.cur().kind == torch::jit::TK_IDENT && L.cur().text() == "op_version_set") {
    L.next();
    L.expect('=');
    L.expect(torch::jit::TK_NUMBER);
    L.expect(torch::jit::TK_NEWLINE);
  }
  while (L.cur().kind != torch::jit::TK_EOF) {
    while (L.nextIf(torch::jit::TK_IMPORT)) {
      while (L.cur().kind != torch::jit::TK_NEWLINE && L.cur().kind != torch::jit::TK_EOF) L.next();
      L.expect(torch::jit::TK_NEWLINE);
    }
    if (L.cur().kind == torch::jit::TK_CLASS_DEF) {
      names.push_back(torch::jit::ClassDef(parser.parseClass()).name().name());
    } else if (L.cur().kind == torch::jit::TK_DEF) {
      parser.parseFunction(/*is_method=*/false);
    } else if (L.cur().kind != torch::jit::TK_EOF) {
      refuse_model("its code has an unexpected top-level statement");
    }
  }
  return names;
}

std::shared_ptr<torch::jit::Source> source_of(caffe2::serialize::PyTorchStreamReader& reader,
                                               const std::string& qualifier) {
  std::string path = qualifier;
  std::replace(path.begin(), path.end(), '.', '/');
  path = "code/" + path + ".py";
  if (!reader.hasRecord(path)) return nullptr;
  auto [data, size] = reader.getRecord(path);
  return std::make_shared<torch::jit::Source>(std::string(static_cast<const char*>(data.get()), size), path, 1);
}

// Code run while torch::jit::load unpickles (`__setstate__` and what it calls) has no deadline: it must be
// straight-line code.
void check_load_time_code(torch::jit::Function& fn) {
  auto* gf = torch::jit::tryToGraphFunction(fn);
  if (!gf) return;
  std::string where = fn.qualname().qualifiedName();
  if (starts_with(where, "__torch__.")) where = where.substr(10);
  auto g = gf->graph()->copy();
  torch::jit::Inline(*g);
  std::vector<Block*> todo = {g->block()};
  while (!todo.empty()) {
    Block* b = todo.back();
    todo.pop_back();
    for (Node* n : b->nodes()) {
      if (n->kind() == c10::prim::Loop) {
        refuse_model("a loop runs while it loads (in " + where + ")");
      }
      if (n->kind() == c10::prim::CallMethod && n->inputs().size() > 0 &&
          n->input(0)->type()->kind() == c10::TypeKind::InterfaceType) {
        refuse_model("an interface method is called while it loads (in " + where + ")");
      }
      for (Block* sb : n->blocks()) todo.push_back(sb);
    }
  }
}

}  // namespace

// ---- public -------------------------------------------------------------------------------------------------

void init(uint64_t memory_bound) {
  static std::once_flag once;
  std::call_once(once, [memory_bound] {
    g_limit.store(memory_bound, std::memory_order_relaxed);
    c10::SetCPUAllocator(&g_allocator, /*priority=*/UINT8_MAX);
    at::globalContext().setCheckSparseTensorInvariants(true);
    torch::jit::setPrintHandler(&silent_print);
    bound_ops();
    scrub_ops();
  });
}

uint64_t live_bytes() { return g_live.load(std::memory_order_relaxed); }

void precheck_archive(const char* data, size_t len) {
  // torch::jit::load takes bytes 4..8 "PTMF" for a flatbuffer (mobile) module, whose loader runs its
  // __setstate__ bytecode as it reads; anything else goes to the zip reader, which reports what is wrong.
  if (len >= 8 && std::memcmp(data + 4, "PTMF", 4) == 0) {
    refuse_model("flatbuffer (mobile) modules are not accepted, only TorchScript zip archives");
  }
  auto reader = std::make_shared<caffe2::serialize::PyTorchStreamReader>(
      std::make_shared<caffe2::serialize::MemoryReadAdapter>(data, static_cast<off_t>(len)));
  if (reader->hasRecord("model.json")) refuse_model("the legacy (PyTorch 1.2) archive format is not accepted");
  const auto records = reader->getAllRecords();
  for (const auto& r : records) {
    if (ends_with(r, ".pkl")) {
      auto [p, n] = reader->getRecord(r);
      scan_pickle(r, static_cast<const uint8_t*>(p.get()), n);
    }
  }
  // Compile everything into a scratch unit, reading the constants and data without running any __setstate__.
  auto cu = std::make_shared<torch::jit::CompilationUnit>();
  std::vector<c10::IValue> constants;
  torch::jit::SourceImporter importer(
      cu, &constants, [&](const std::string& q) { return source_of(*reader, q); }, reader->version());
  // A TorchScript class's __setstate__ is not run: its object stays an empty placeholder. An allowed C++ class's
  // (quantized packed weights) is, on tensors checked first: frozen models hold such objects as constants, which
  // their code is compiled against.
  auto placeholder = c10::ClassType::create(c10::QualifiedName("__torch__.__redisai_unrun_setstate__"), cu);
  TensorChecker tensors;
  auto resolver = [&](const c10::QualifiedName& qn) { return c10::StrongTypePtr(cu, importer.loadType(qn)); };
  auto loader = [&](const c10::StrongTypePtr& type, c10::IValue input) {
    tensors.walk(input);
    auto cls = type.type_->expect<c10::ClassType>();
    const size_t n = cls->numAttributes();
    if (auto* set_state = cls->findMethod("__setstate__")) {
      const std::string name = cls->name() ? cls->name()->qualifiedName() : "";
      if (!starts_with(name, kClassPrefix)) {
        return c10::ivalue::Object::create(c10::StrongTypePtr(cu, placeholder), 0);
      }
      if (const char* why = class_reason(name)) {
        refuse_model("its data holds an object of class " + name.substr(10) + ", which " + why);
      }
      auto obj = c10::ivalue::Object::create(type, n);
      (*set_state)({obj, input});
      return obj;
    }
    auto dict = std::move(input).toGenericDict();
    auto obj = c10::ivalue::Object::create(type, n);
    for (size_t i = 0; i < n; ++i) obj->setSlot(i, dict.at(cls->getAttributeName(i)));
    return obj;
  };
  // Every code file the importer can reach, before anything parses it: its nesting, then its classes.
  std::vector<c10::QualifiedName> classes;
  for (const auto& r : records) {
    if (!starts_with(r, "code/") || !ends_with(r, ".py")) continue;
    std::string qualifier = r.substr(5, r.size() - 8);
    std::replace(qualifier.begin(), qualifier.end(), '/', '.');
    auto src = source_of(*reader, qualifier);
    if (!src) continue;  // a path no qualifier maps to: torch::jit::load cannot reach it either
    check_source_depth(src, /*script=*/false);
    for (const auto& name : class_names(src)) classes.emplace_back(qualifier, name);
  }
  auto ct = torch::jit::readArchiveAndTensors("constants", "", "", resolver, loader, c10::Device(c10::kCPU), *reader);
  tensors.walk(ct);
  for (const auto& c : ct.toTupleRef().elements()) constants.push_back(c);
  for (const auto& qn : classes) importer.loadType(qn);
  tensors.walk(torch::jit::readArchiveAndTensors("data", "", "", resolver, loader, c10::Device(c10::kCPU), *reader));
  Inspector ins(/*script=*/false);
  auto fns = all_functions(*cu);
  for (auto* fn : fns) ins.function(*fn);
  for (auto* fn : fns) {
    if (fn->name() == "__setstate__") check_load_time_code(*fn);
  }
}

void check_script_source(const std::string& source) {
  check_source_depth(std::make_shared<torch::jit::Source>(source), /*script=*/true);
}

void admit_model(const torch::jit::Module& m) { admit(*m.type()->compilation_unit(), /*script=*/false); }

void admit_script(const torch::jit::CompilationUnit& cu) { admit(cu, /*script=*/true); }

RunScope::RunScope(uint64_t timeout_ms)
    : saved_deadline_(tl_run.deadline_ns),
      saved_timeout_(tl_run.timeout_ms),
      saved_next_state_(tl_run.next_state_ns),
      saved_loops_(tl_loops.size()),
      saved_handler_(c10::WarningUtils::get_warning_handler()) {
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
  tl_run.deadline_ns = saved_deadline_;
  tl_run.timeout_ms = saved_timeout_;
  tl_run.next_state_ns = saved_next_state_;
  if (tl_loops.size() > saved_loops_) tl_loops.resize(saved_loops_);
  tl_run.loops = tl_loops.size();
  c10::WarningUtils::set_warning_handler(static_cast<c10::WarningHandler*>(saved_handler_));
}

QuietScope::QuietScope() : saved_handler_(c10::WarningUtils::get_warning_handler()) {
  c10::WarningUtils::set_warning_handler(&g_silent);
}

QuietScope::~QuietScope() {
  c10::WarningUtils::set_warning_handler(static_cast<c10::WarningHandler*>(saved_handler_));
}

std::string reply_text(const std::string& what) {
  for (const char* marker : {kTimeoutError, kMemoryError, kDepthError, kCycleError}) {
    auto at = what.find(marker);
    if (at != std::string::npos) {
      auto end = what.find('\n', at);
      std::string line = what.substr(at, end == std::string::npos ? std::string::npos : end - at);
      // The memory text is RedisAI's (as ONNX's): the details stay in the log-free message.
      return marker == kMemoryError ? std::string(kMemoryError) : line;
    }
  }
  return what;
}

}  // namespace rai

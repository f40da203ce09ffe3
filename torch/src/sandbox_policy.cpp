// The sandbox's policy (sandbox.cpp gives the overview, sections 1 and 3): which operators, namespaces and custom
// classes compiled code may reach, the walk of every function that refuses the rest, and the instrumentation
// admitted code gets (the deadline check in every loop, the depth check before every store of an erased value;
// the operators themselves are sandbox_limits.cpp's).

#include "sandbox_policy.h"

#include "sandbox.h"
#include "sandbox_calls.h"

#include <torch/csrc/jit/api/function_impl.h>
#include <torch/csrc/jit/ir/ir.h>

#include <algorithm>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace rai {
namespace detail {
namespace {

using torch::jit::Block;
using torch::jit::Graph;
using torch::jit::Node;
using torch::jit::Value;

// ---- refusals -----------------------------------------------------------------------------------------------

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

}  // namespace

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

[[noreturn]] void refuse_model(const std::string& why) { throw Refused("TORCH model refused: " + why); }

namespace {

// ---- what a type can hold -----------------------------------------------------------------------------------

// What a type walk looks for: type kinds, and how deep into contained types it looks (a type nested deeper
// counts as holding them: the walk fails closed, so nesting cannot hide a kind from a check).
struct TypeKinds {
  std::vector<c10::TypeKind> kinds;
  int max_depth;
};

// Whether `t`, or a type it contains, is of one of `what`'s kinds.
bool holds(const c10::TypePtr& t, const TypeKinds& what, int depth = 0) {
  if (!t) return false;
  if (depth > what.max_depth) return true;
  if (std::find(what.kinds.begin(), what.kinds.end(), t->kind()) != what.kinds.end()) return true;
  for (const auto& c : t->containedTypes()) {
    if (holds(c, what, depth + 1)) return true;
  }
  return false;
}

// Types whose printed form holds a memory address ("<__torch__.M object at 0x...>"). `Any` is not among them:
// redis.execute returns Any, and str() of its reply is how scripts read it (RedisAI's own examples).
const TypeKinds kShowsAddress = {{c10::TypeKind::ClassType, c10::TypeKind::InterfaceType,
                                  c10::TypeKind::AnyClassType, c10::TypeKind::CapsuleType,
                                  c10::TypeKind::FutureType, c10::TypeKind::AwaitType, c10::TypeKind::RRefType,
                                  c10::TypeKind::FunctionType, c10::TypeKind::PyObjectType},
                                 32};

// Types that hide what a value holds (`Any`, interfaces): only through them can code nest a value in itself
// level after level (`y: Any = x; x = [y]`), which libtorch would later destroy, print or compare recursively
// until the stack overflows.
const TypeKinds kErased = {{c10::TypeKind::AnyType, c10::TypeKind::AnyListType, c10::TypeKind::AnyTupleType,
                            c10::TypeKind::AnyClassType, c10::TypeKind::InterfaceType},
                           64};

// Types whose values hold memory outside tensors: strings, containers, objects (what a loop can grow), and the
// erased types, which may hold any of them.
const TypeKinds kHoldsMemory = {{c10::TypeKind::StringType, c10::TypeKind::ListType, c10::TypeKind::DictType,
                                 c10::TypeKind::ClassType, c10::TypeKind::AnyType, c10::TypeKind::AnyListType,
                                 c10::TypeKind::AnyTupleType, c10::TypeKind::AnyClassType,
                                 c10::TypeKind::InterfaceType},
                                64};

// ---- the walk of compiled code ------------------------------------------------------------------------------

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
        if (holds(v->type(), kShowsAddress)) {
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

// ---- instrumentation ----------------------------------------------------------------------------------------

const c10::Symbol kCheckDeadline = c10::Symbol::fromQualString("redisai::check_deadline");
const c10::Symbol kCheckStore = c10::Symbol::fromQualString("redisai::check_store");

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
    if (!holds(v->type(), kErased)) return;
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

bool within(const Block* b, const Block* outer) {
  for (; b; b = b->owningNode() ? b->owningNode()->owningBlock() : nullptr) {
    if (b == outer) return true;
  }
  return false;
}

// The values defined outside `body` that `b` (inside it) uses and that hold memory outside tensors.
void used_from_outside(const Block* body, Block* b, std::vector<Value*>& out, std::unordered_set<Value*>& seen) {
  auto use = [&](Value* v) {
    if (!within(v->node()->owningBlock(), body) && holds(v->type(), kHoldsMemory) && seen.insert(v).second) {
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
          if (holds(body->inputs()[i]->type(), kHoldsMemory) && seen.insert(body->inputs()[i]).second) {
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
  const auto fns = inspect(cu, script);
  check_calls(fns, script);
  for (auto* fn : fns) {
    if (auto* gf = torch::jit::tryToGraphFunction(*fn)) instrument(gf->graph()->block());
  }
}

}  // namespace

std::vector<torch::jit::Function*> inspect(const torch::jit::CompilationUnit& cu, bool script) {
  Inspector ins(script);
  auto fns = all_functions(cu);
  for (auto* fn : fns) ins.function(*fn);
  return fns;
}

bool may_show_address(const c10::TypePtr& t) { return holds(t, kShowsAddress); }

}  // namespace detail

void admit_model(const torch::jit::Module& m) { detail::admit(*m.type()->compilation_unit(), /*script=*/false); }

void admit_script(const torch::jit::CompilationUnit& cu) { detail::admit(cu, /*script=*/true); }

}  // namespace rai

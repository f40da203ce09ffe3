// The sandbox's checks of a model archive before torch::jit::load (sandbox.cpp gives the overview, section 2):
// its format, its pickles and code (sandbox_scan.cpp's scanners), every function of its code compiled into a
// scratch unit and checked (sandbox_policy.cpp), its tensors against their storage, and no loop reachable from a
// `__setstate__`. Also the check of a script's source before it is compiled.

#include "sandbox.h"

#include "sandbox_calls.h"
#include "sandbox_limits.h"
#include "sandbox_policy.h"
#include "sandbox_scan.h"

#include <caffe2/serialize/in_memory_adapter.h>
#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/api/function_impl.h>
#include <torch/csrc/jit/ir/ir.h>
#include <torch/csrc/jit/passes/inliner.h>
#include <torch/csrc/jit/serialization/import_read.h>
#include <torch/csrc/jit/serialization/import_source.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <unordered_set>
#include <vector>

namespace rai {
namespace detail {
namespace {

using torch::jit::Block;
using torch::jit::Node;

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
}  // namespace detail

// ---- public -------------------------------------------------------------------------------------------------

using namespace detail;

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
  int defs = 0;
  for (const auto& r : records) {
    if (!starts_with(r, "code/") || !ends_with(r, ".py")) continue;
    std::string qualifier = r.substr(5, r.size() - 8);
    std::replace(qualifier.begin(), qualifier.end(), '/', '.');
    auto src = source_of(*reader, qualifier);
    if (!src) continue;  // a path no qualifier maps to: torch::jit::load cannot reach it either
    defs += check_source_depth(src, /*script=*/false);
    if (defs > kMaxFunctions) {
      refuse_model("its code defines more than " + std::to_string(kMaxFunctions) + " functions and methods");
    }
    for (const auto& name : class_names(src)) classes.emplace_back(qualifier, name);
  }
  auto ct = torch::jit::readArchiveAndTensors("constants", "", "", resolver, loader, c10::Device(c10::kCPU), *reader);
  tensors.walk(ct);
  for (const auto& c : ct.toTupleRef().elements()) constants.push_back(c);
  for (const auto& qn : classes) importer.loadType(qn);
  tensors.walk(torch::jit::readArchiveAndTensors("data", "", "", resolver, loader, c10::Device(c10::kCPU), *reader));
  const auto fns = inspect(*cu, /*script=*/false);
  check_calls(fns, /*script=*/false);  // before torch::jit::load runs __setstate__ (its first run inlines calls)
  for (auto* fn : fns) {
    if (fn->name() == "__setstate__") check_load_time_code(*fn);
  }
}

void check_script_source(const std::string& source) {
  if (check_source_depth(std::make_shared<torch::jit::Source>(source), /*script=*/true) > kMaxFunctions) {
    throw Refused("TORCH script refused: it defines more than " + std::to_string(kMaxFunctions) + " functions");
  }
}

}  // namespace rai

// A thin C layer over torch::jit for what tch does not expose: a module's forward() argument names and
// return arity, TorchScript compilation (torch::jit::compile) and calling a compiled function.
// Every function catches every C++ exception (c10::Error, std::exception, anything else) and returns its kind (the
// codes of src/backends/torch_abi.rs) with its message through `err` (malloc'd), and is noexcept: nothing may
// unwind into the Rust caller, where it would be undefined behaviour (a throw that escaped a catch would end in
// std::terminate instead).
// Every model and script goes through the sandbox (sandbox.cpp) before it runs, and every run has a deadline.

#include "sandbox.h"
#include "torch_abi.h"

#include <torch/csrc/jit/frontend/resolver.h>
#include <torch/csrc/jit/frontend/sugared_value.h>
#include <torch/jit.h>
#include <torch/script.h>
#include <torch/version.h>

#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

namespace {

char* dup(const std::string& s) {
  char* p = static_cast<char*>(std::malloc(s.size() + 1));
  if (p) {
    std::memcpy(p, s.data(), s.size());
    p[s.size()] = 0;
  }
  return p;
}

// A caught exception (null: not a std::exception) as the client gets it: its text in `*err`, its kind returned
// (rai::failure: the codes of src/backends/torch_abi.rs).
int fail(char** err, const std::exception* e) {
  rai::Failure f = rai::failure(e);
  *err = dup(f.text);
  return f.code;
}

c10::Device device(int gpu) { return gpu < 0 ? c10::Device(c10::kCPU) : c10::Device(c10::kCUDA, gpu); }

// Tensors of a tensor, a tuple or a list (nested), in order; false if anything else is found.
bool flatten(const c10::IValue& v, std::vector<at::Tensor>& out) {
  if (v.isTensor()) {
    out.push_back(v.toTensor());
  } else if (v.isTuple()) {
    for (const auto& e : v.toTupleRef().elements()) {
      if (!flatten(e, out)) return false;
    }
  } else if (v.isList()) {
    for (const auto& e : v.toListRef()) {
      if (!flatten(e, out)) return false;
    }
  } else {
    return false;
  }
  return true;
}

at::Tensor** to_array(const std::vector<at::Tensor>& v) {
  auto** arr = new at::Tensor*[v.size() ? v.size() : 1];
  for (size_t i = 0; i < v.size(); ++i) arr[i] = new at::Tensor(v[i]);
  return arr;
}

bool list_of(const c10::TypePtr& t, c10::TypeKind kind) {
  auto l = t->cast<c10::ListType>();
  return l && l->getElementType()->kind() == kind;
}

struct Script {
  std::shared_ptr<torch::jit::CompilationUnit> cu;
  c10::Device dev;
};

// A loaded model and the device its parameters live on (inputs are moved there for each run).
struct Model {
  torch::jit::Module module;
  c10::Device dev;
};

// ---- TorchScript extensions: redis.execute, redis.asList, redisAI.model_execute -------------------
// The module hands us callbacks (`rai_shim_set_host`); their structs (StrView, TensorView, TensorOut, HostApi)
// come from torch_abi.h, which torch/build.rs generates from src/backends/torch_abi.rs.
HostApi g_host{};

StrView str_view(const std::string& s) { return {reinterpret_cast<const uint8_t*>(s.data()), s.size()}; }

// The sandbox's failure codes are the ABI's.
static_assert(rai::kFailedCode == RAI_FAILED && rai::kRefusedCode == RAI_REFUSED &&
                  rai::kTimedOutCode == RAI_TIMED_OUT && rai::kMemoryCode == RAI_OVER_MEMORY,
              "sandbox.h's codes differ from src/backends/torch_abi.rs");

// The module's dtype order: FLOAT DOUBLE INT8 INT16 INT32 INT64 UINT8 UINT16 BOOL STRING.
const c10::ScalarType kTypes[] = {c10::kFloat, c10::kDouble, c10::kChar, c10::kShort, c10::kInt,
                                  c10::kLong,  c10::kByte,   c10::kUInt16, c10::kBool};

int dtype_index(c10::ScalarType t) {
  for (int i = 0; i < 9; ++i) {
    if (i != 7 && kTypes[i] == t) return i;
  }
  throw std::runtime_error(std::string("unsupported tensor type ") + c10::toString(t));
}

// A RESP reply (as the module encodes Redis's reply) to an IValue: strings, integers, nested lists, None.
// Nesting is capped: libtorch destroys and prints values recursively (and so does this parser).
constexpr int kMaxReplyDepth = 128;

c10::IValue parse_resp(const char*& p, const char* end, int depth = 0) {
  if (depth > kMaxReplyDepth) throw std::runtime_error("Redis command returned a reply nested too deeply");
  const char* eol = static_cast<const char*>(memchr(p, '\r', end - p));
  if (!eol) throw std::runtime_error("Redis command returned an unreadable reply");
  char kind = *p;
  std::string head(p + 1, eol);
  p = eol + 2;
  switch (kind) {
    case '+':
      return c10::IValue(head);
    case '-':
      throw std::runtime_error("Redis command returned an error: " + head);
    case ':':
      return c10::IValue(static_cast<int64_t>(std::stoll(head)));
    case '$': {
      long n = std::stol(head);
      if (n < 0) return c10::IValue();
      if (n > end - p) throw std::runtime_error("Redis command returned an unreadable reply");
      std::string v(p, static_cast<size_t>(n));
      p += n + 2;
      return c10::IValue(v);
    }
    case '*': {
      long n = std::stol(head);
      if (n < 0) return c10::IValue();
      c10::impl::GenericList list(c10::AnyType::get());
      for (long i = 0; i < n; ++i) list.push_back(parse_resp(p, end, depth + 1));
      return c10::IValue(list);
    }
    default:
      return c10::IValue();
  }
}

c10::IValue redis_execute(const std::string& cmd, const std::vector<std::string>& args) {
  if (!g_host.redis_call) throw std::runtime_error("redis.execute is not available");
  std::vector<StrView> v;
  for (const auto& a : args) v.push_back(str_view(a));
  uint8_t* out = nullptr;
  size_t len = 0;
  const int rc = g_host.redis_call(str_view(cmd), v.data(), v.size(), &out, &len);
  std::string resp = out ? std::string(reinterpret_cast<char*>(out), len) : std::string();
  if (out) g_host.free_bytes(out, len);
  if (rc != 0 || resp.empty()) throw std::runtime_error("redis.execute failed");
  const char* p = resp.data();
  return parse_resp(p, resp.data() + resp.size());
}

c10::impl::GenericList as_list(const c10::IValue& v) { return v.toList(); }

std::vector<at::Tensor> model_execute(const std::string& key, const std::vector<at::Tensor>& inputs,
                                      int64_t noutputs) {
  if (!g_host.model_execute) throw std::runtime_error("redisAI.model_execute is not available");
  std::vector<at::Tensor> owned;
  std::vector<TensorView> views;
  for (const auto& t : inputs) {
    owned.push_back(t.to(c10::kCPU).contiguous());
    const auto& c = owned.back();
    views.push_back({static_cast<uint32_t>(dtype_index(c.scalar_type())), static_cast<uint32_t>(c.dim()),
                     c.sizes().data(), static_cast<const uint8_t*>(c.data_ptr()), c.nbytes()});
  }
  TensorOut* outs = nullptr;
  size_t n = 0;
  char* err = nullptr;
  if (g_host.model_execute(str_view(key), views.data(), views.size(), static_cast<size_t>(noutputs), &outs, &n,
                           &err) != 0) {
    std::string msg = err ? err : "model execution failed";
    if (err) g_host.free_string(err);
    throw std::runtime_error(msg);
  }
  // The host's tensors are freed however this ends (a STRING output, a size that does not match).
  std::unique_ptr<TensorOut, std::function<void(TensorOut*)>> held(outs, [n](TensorOut* o) {
    if (o) g_host.free_tensors(o, n);
  });
  std::vector<at::Tensor> result;
  for (size_t i = 0; i < n; ++i) {
    if (outs[i].dtype >= sizeof kTypes / sizeof kTypes[0]) {
      throw std::runtime_error("redisAI.model_execute: the model returned a tensor type TorchScript cannot hold");
    }
    std::vector<int64_t> shape(outs[i].shape, outs[i].shape + outs[i].ndim);
    auto t = torch::empty(shape, torch::TensorOptions().dtype(kTypes[outs[i].dtype]));
    TORCH_CHECK(outs[i].len == t.nbytes(), "redisAI.model_execute: an output's data does not match its shape");
    if (outs[i].len) std::memcpy(t.data_ptr(), outs[i].data, outs[i].len);
    result.push_back(t);
  }
  return result;
}

// `redis` and `redisAI` in script source name the custom ops above.
struct Resolver : public torch::jit::Resolver {
  std::shared_ptr<torch::jit::SugaredValue> resolveValue(const std::string& name, torch::jit::GraphFunction& m,
                                                         const torch::jit::SourceRange& loc) override {
    if (name == "redis" || name == "redisAI") return std::make_shared<torch::jit::BuiltinModule>(name);
    if (name == "torch") return std::make_shared<torch::jit::BuiltinModule>("aten");
    return nullptr;
  }
  c10::TypePtr resolveType(const std::string& name, const torch::jit::SourceRange& loc) override { return nullptr; }
};

auto registry = torch::RegisterOperators("redis::execute", &redis_execute)
                    .op("redis::asList", &as_list)
                    .op("redisAI::model_execute", &model_execute);

}  // namespace

extern "C" {

void rai_shim_set_host(const HostApi* host) noexcept { g_host = *host; }

// Installs the sandbox (allocator bound in bytes, 0: none); 0 on success.
int rai_shim_configure(uint64_t memory_bound, char** err) noexcept {
  try {
    rai::init(memory_bound);
    return 0;
  } catch (const std::exception& e) {
    return fail(err, &e);
  } catch (...) {
    return fail(err, nullptr);
  }
}

uint64_t rai_shim_live_bytes() noexcept { return rai::live_bytes(); }

void rai_shim_next_block_written(uint64_t n) noexcept { rai::next_block_written(n); }

// The libtorch this library was built against (INFO's ai_Torch_version), from its own headers.
const char* rai_shim_torch_version() noexcept { return TORCH_VERSION; }

void rai_shim_free_string(char* s) noexcept { std::free(s); }
void rai_shim_free_array(at::Tensor** a) noexcept { delete[] a; }

// Loads a TorchScript module; `names` gets forward()'s argument names joined by '\n', `noutputs` the
// number of values it returns (a returned tuple counts its elements).
void* rai_shim_module_load(const char* data, size_t len, int gpu, char** names, size_t* noutputs, char** err,
                           int* code) noexcept {
  try {
    std::unique_ptr<Model> model;
    rai::on_compile_stack([&] {
      rai::QuietScope quiet;
      rai::precheck_archive(data, len);
      std::istringstream in(std::string(data, len));
      model = std::make_unique<Model>(Model{torch::jit::load(in, device(gpu), /*load_debug_files=*/false), device(gpu)});
      rai::admit_model(model->module);
      model->module.eval();
    });
    auto* m = &model->module;
    const auto& schema = m->get_method("forward").function().getSchema();
    std::string joined;
    for (size_t i = 1; i < schema.arguments().size(); ++i) {
      if (i > 1) joined += '\n';
      joined += schema.arguments()[i].name();
    }
    size_t n = 0;
    for (const auto& r : schema.returns()) {
      auto tuple = r.type()->cast<c10::TupleType>();
      n += tuple ? tuple->elements().size() : 1;
    }
    *names = dup(joined);
    *noutputs = n;
    return model.release();
  } catch (const std::exception& e) {
    *code = fail(err, &e);
    return nullptr;
  } catch (...) {
    *code = fail(err, nullptr);
    return nullptr;
  }
}

int rai_shim_module_forward(void* module, at::Tensor* const* inputs, size_t n, uint64_t timeout_ms, at::Tensor*** outs,
                            size_t* nout, char** err) noexcept {
  try {
    rai::RunScope scope(timeout_ms);
    c10::InferenceMode guard;
    std::vector<c10::IValue> args;
    auto* model = static_cast<Model*>(module);
    // Inputs come from the module in CPU memory; a model on GPU:n gets them there (outputs go back to CPU).
    for (size_t i = 0; i < n; ++i) args.emplace_back(inputs[i]->to(model->dev));
    auto r = model->module.forward(args);
    std::vector<at::Tensor> v;
    if (!flatten(r, v)) {
      *err = dup("Model returned non-tensor values");
      return 1;
    }
    *outs = to_array(v);
    *nout = v.size();
    return 0;
  } catch (const std::exception& e) {
    return fail(err, &e);
  } catch (...) {
    return fail(err, nullptr);
  }
}

// Destroying a module or script runs no code of its own; a throw here (none is known) ends the process rather than
// unwinding into Rust.
void rai_shim_module_free(void* module) noexcept { delete static_cast<Model*>(module); }

void* rai_shim_script_compile(const char* src, size_t len, int gpu, char** err, int* code) noexcept {
  try {
    auto cu = std::make_shared<torch::jit::CompilationUnit>();
    // TorchScript's parser wants a final newline, which clients (and `$(...)` in shells) often drop.
    std::string source(src, len);
    if (source.empty() || source.back() != '\n') source += '\n';
    rai::on_compile_stack([&] {
      rai::QuietScope quiet;
      rai::check_script_source(source);
      cu->define(std::nullopt, source, std::make_shared<Resolver>(), nullptr);
      rai::admit_script(*cu);
    });
    return new Script{cu, device(gpu)};
  } catch (const std::exception& e) {
    *code = fail(err, &e);
    return nullptr;
  } catch (...) {
    *code = fail(err, nullptr);
    return nullptr;
  }
}

void rai_shim_script_free(void* script) noexcept { delete static_cast<Script*>(script); }

// RedisAI's entry-point check: def f(tensors: List[Tensor], keys: List[str], args: List[str]).
int rai_shim_script_check_entry(void* script, const char* name, char** err) noexcept {
  try {
    auto* s = static_cast<Script*>(script);
    std::string fn(name);
    auto* f = s->cu->find_function(fn);
    if (!f) {
      *err = dup("Function " + fn + " does not exist in the given script.");
      return 1;
    }
    const auto& a = f->getSchema().arguments();
    if (a.size() != 3) {
      *err = dup("Wrong number of inputs in function " + fn + ". Expected 3 but was " + std::to_string(a.size()));
      return 1;
    }
    if (!list_of(a[0].type(), c10::TypeKind::TensorType) || !list_of(a[1].type(), c10::TypeKind::StringType) ||
        !list_of(a[2].type(), c10::TypeKind::StringType)) {
      *err = dup("Wrong inputs type in function " + fn + ". Expected signature similar to: def " + fn +
                 "(tensors: List[Tensor], keys: List[str], args: List[str])");
      return 1;
    }
    return 0;
  } catch (const std::exception& e) {
    return fail(err, &e);
  } catch (...) {
    return fail(err, nullptr);
  }
}

// Calls `name`. call 0: (tensors, keys, args) entry point; call 1: positional tensors, where a List[Tensor]
// parameter takes the tensors from `list_from` on (or every remaining tensor when list_from < 0).
int rai_shim_script_run(void* script, const char* name, int call, at::Tensor* const* tensors, size_t n,
                        long list_from, const char* const* keys, const size_t* key_lens, size_t nkeys,
                        const char* const* args, const size_t* arg_lens, size_t nargs, uint64_t timeout_ms,
                        at::Tensor*** outs, size_t* nout, char** err) noexcept {
  try {
    std::string fn(name);
    auto* s = static_cast<Script*>(script);
    auto* f = s->cu->find_function(fn);
    if (!f) {
      *err = dup("Function does not exist: " + fn);
      return 1;
    }
    rai::RunScope scope(timeout_ms);
    c10::InferenceMode guard;
    std::vector<c10::IValue> stack;
    if (call == RAI_CALL_ENTRY_POINT) {
      c10::List<at::Tensor> ts;
      for (size_t i = 0; i < n; ++i) ts.push_back(tensors[i]->to(s->dev));
      c10::List<std::string> ks, as;
      for (size_t i = 0; i < nkeys; ++i) ks.push_back(std::string(keys[i], key_lens[i]));
      for (size_t i = 0; i < nargs; ++i) as.push_back(std::string(args[i], arg_lens[i]));
      stack = {ts, ks, as};
    } else {
      size_t positional = list_from >= 0 ? static_cast<size_t>(list_from) : n;
      size_t next = 0;
      bool list_taken = false;
      for (const auto& arg : f->getSchema().arguments()) {
        if (arg.type()->kind() == c10::TypeKind::TensorType) {
          if (next >= positional) {
            *err = dup("Wrong number of inputs provided to function: " + fn);
            return 1;
          }
          stack.emplace_back(tensors[next++]->to(s->dev));
        } else if (list_of(arg.type(), c10::TypeKind::TensorType) && !list_taken) {
          c10::List<at::Tensor> l;
          if (list_from >= 0) next = static_cast<size_t>(list_from);
          while (next < n) l.push_back(tensors[next++]->to(s->dev));
          stack.emplace_back(l);
          list_taken = true;
        } else {
          *err = dup("Unsupported input type in function definition: " + fn);
          return 1;
        }
      }
      if (next != n) {
        *err = dup("Wrong number of inputs provided to function: " + fn);
        return 1;
      }
    }
    auto r = (*f)(stack);
    std::vector<at::Tensor> v;
    if (!flatten(r, v)) {
      // An error only if the caller asked for OUTPUTS (the module decides).
      *err = dup("Function returned non-tensor values" + fn);
      return RAI_SCRIPT_NON_TENSOR;
    }
    *outs = to_array(v);
    *nout = v.size();
    return 0;
  } catch (const std::exception& e) {
    return fail(err, &e);
  } catch (...) {
    return fail(err, nullptr);
  }
}

}  // extern "C"

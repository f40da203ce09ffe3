// A thin C layer over torch::jit for what tch does not expose: a module's forward() argument names and
// return arity, TorchScript compilation (torch::jit::compile) and calling a compiled function.
// Every function catches C++ exceptions and returns their message through `err` (malloc'd).

#include <torch/jit.h>
#include <torch/script.h>

#include <cstdlib>
#include <cstring>
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

}  // namespace

extern "C" {

void rai_shim_free_string(char* s) { std::free(s); }
void rai_shim_free_array(at::Tensor** a) { delete[] a; }

// Loads a TorchScript module; `names` gets forward()'s argument names joined by '\n', `noutputs` the
// number of values it returns (a returned tuple counts its elements).
void* rai_shim_module_load(const char* data, size_t len, int gpu, char** names, size_t* noutputs, char** err) {
  try {
    std::istringstream in(std::string(data, len));
    auto* m = new torch::jit::Module(torch::jit::load(in, device(gpu)));
    m->eval();
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
    return m;
  } catch (const c10::Error& e) {
    *err = dup(e.what_without_backtrace());
    return nullptr;
  } catch (const std::exception& e) {
    *err = dup(e.what());
    return nullptr;
  }
}

int rai_shim_module_forward(void* module, at::Tensor* const* inputs, size_t n, at::Tensor*** outs, size_t* nout,
                            char** err) {
  try {
    c10::InferenceMode guard;
    std::vector<c10::IValue> args;
    for (size_t i = 0; i < n; ++i) args.emplace_back(*inputs[i]);
    auto r = static_cast<torch::jit::Module*>(module)->forward(args);
    std::vector<at::Tensor> v;
    if (!flatten(r, v)) {
      *err = dup("Model returned non-tensor values");
      return 1;
    }
    *outs = to_array(v);
    *nout = v.size();
    return 0;
  } catch (const c10::Error& e) {
    *err = dup(e.what_without_backtrace());
    return 1;
  } catch (const std::exception& e) {
    *err = dup(e.what());
    return 1;
  }
}

void rai_shim_module_free(void* module) { delete static_cast<torch::jit::Module*>(module); }

void* rai_shim_script_compile(const char* src, size_t len, int gpu, char** err) {
  try {
    auto cu = torch::jit::compile(std::string(src, len));
    return new Script{cu, device(gpu)};
  } catch (const c10::Error& e) {
    *err = dup(e.what_without_backtrace());
    return nullptr;
  } catch (const std::exception& e) {
    *err = dup(e.what());
    return nullptr;
  }
}

void rai_shim_script_free(void* script) { delete static_cast<Script*>(script); }

// RedisAI's entry-point check: def f(tensors: List[Tensor], keys: List[str], args: List[str]).
int rai_shim_script_check_entry(void* script, const char* name, char** err) {
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
  } catch (const c10::Error& e) {
    *err = dup(e.what_without_backtrace());
    return 1;
  } catch (const std::exception& e) {
    *err = dup(e.what());
    return 1;
  }
}

// Calls `name`. call 0: (tensors, keys, args) entry point; call 1: positional tensors, where a List[Tensor]
// parameter takes the tensors from `list_from` on (or every remaining tensor when list_from < 0).
int rai_shim_script_run(void* script, const char* name, int call, at::Tensor* const* tensors, size_t n,
                        long list_from, const char* const* keys, const size_t* key_lens, size_t nkeys,
                        const char* const* args, const size_t* arg_lens, size_t nargs, at::Tensor*** outs,
                        size_t* nout, char** err) {
  std::string fn(name);
  try {
    auto* s = static_cast<Script*>(script);
    auto* f = s->cu->find_function(fn);
    if (!f) {
      *err = dup("Function does not exist: " + fn);
      return 1;
    }
    c10::InferenceMode guard;
    std::vector<c10::IValue> stack;
    if (call == 0) {
      c10::List<at::Tensor> ts;
      for (size_t i = 0; i < n; ++i) ts.push_back(*tensors[i]);
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
          stack.emplace_back(*tensors[next++]);
        } else if (list_of(arg.type(), c10::TypeKind::TensorType) && !list_taken) {
          c10::List<at::Tensor> l;
          if (list_from >= 0) next = static_cast<size_t>(list_from);
          while (next < n) l.push_back(*tensors[next++]);
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
      *err = dup("Function returned non-tensor values" + fn);
      return 1;
    }
    *outs = to_array(v);
    *nout = v.size();
    return 0;
  } catch (const c10::Error& e) {
    *err = dup(e.what_without_backtrace());
    return 1;
  } catch (const std::exception& e) {
    *err = dup(e.what());
    return 1;
  }
}

}  // extern "C"

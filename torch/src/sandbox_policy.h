// Internal to the sandbox (sandbox.cpp gives the overview): what compiled code may reach, and the refusals every
// part of the sandbox throws. Defined in sandbox_policy.cpp.
#pragma once

#include <ATen/core/jit_type_base.h>

#include <stdexcept>
#include <string>
#include <vector>

namespace torch::jit {
struct CompilationUnit;
struct Function;
}  // namespace torch::jit

namespace rai::detail {

// What every check throws: its text starts with "TORCH model refused:" or "TORCH script refused:".
struct Refused : std::runtime_error {
  using std::runtime_error::runtime_error;
};

[[noreturn]] void refuse_model(const std::string& why);

inline bool starts_with(const std::string& s, const std::string& p) { return s.compare(0, p.size(), p) == 0; }
inline bool ends_with(const std::string& s, const std::string& p) {
  return s.size() >= p.size() && s.compare(s.size() - p.size(), p.size(), p) == 0;
}

inline const std::string kClassPrefix = "__torch__.torch.classes.";

// Why a custom (C++) class is refused (`__torch__.torch.classes.<ns>.<name>` or `<ns>.<name>`); nullptr when
// allowed.
const char* class_reason(const std::string& qualname);

// Whether str()/format of a value of type `t` could print a memory address (an object, a future …, at any
// depth; a type nested past the walk's bound counts as one).
bool may_show_address(const c10::TypePtr& t);

// Every function of `cu`, compiled, each checked against the policy (operators, classes, formatting); throws the
// refusal. Returns the functions.
std::vector<torch::jit::Function*> inspect(const torch::jit::CompilationUnit& cu, bool script);

}  // namespace rai::detail

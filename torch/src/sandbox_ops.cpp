// The sandbox's operator replacements (sandbox.cpp gives the overview, section 4): string, list and view ops
// bounded by the memory bound before they run, and ops that return memory they have not written zeroing it.

#include "sandbox_ops.h"

#include "sandbox_limits.h"

#include <torch/csrc/jit/runtime/custom_operator.h>
#include <torch/csrc/jit/runtime/operator.h>
#include <torch/script.h>

#include <algorithm>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

namespace rai::detail {
namespace {

using torch::jit::Stack;

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

}  // namespace

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

namespace {

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

}  // namespace

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

}  // namespace rai::detail

// Unit tests of the TORCH sandbox's hand-written scanners of untrusted input (torch/src/sandbox_scan.cpp):
// scan_pickle (a model archive's pickles), check_source_depth and class_names (TorchScript source). Good inputs
// must pass, crafted ones (truncated, deeply nested, cyclic, huge lengths, refused opcodes and classes) must be
// refused with Refused, and nothing may crash or throw anything else.
//
// Built and run by torch/tests/run-cpp-tests.sh (`make test`). Exits 1 when any check fails, naming each.

#include "../src/sandbox_calls.h"
#include "../src/sandbox_policy.h"
#include "../src/sandbox_scan.h"

#include <ATen/core/jit_type.h>
#include <torch/csrc/jit/api/compilation_unit.h>
#include <torch/csrc/jit/frontend/resolver.h>
#include <torch/csrc/jit/frontend/source_range.h>
#include <torch/csrc/jit/serialization/pickle.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <exception>
#include <functional>
#include <random>
#include <string>
#include <vector>

using rai::detail::kMaxPickleDepth;
using rai::detail::kMaxSourceDepth;
using rai::detail::Refused;

namespace {

int g_cases = 0;
int g_failed = 0;

// Runs one case: `body` returns "" when it holds, else what went wrong.
void test(const std::string& name, const std::function<std::string()>& body) {
  ++g_cases;
  std::string failure;
  try {
    failure = body();
  } catch (const std::exception& e) {
    failure = std::string("unexpected exception: ") + e.what();
  } catch (...) {
    failure = "unexpected non-std exception";
  }
  if (failure.empty()) {
    std::printf("ok     %s\n", name.c_str());
  } else {
    ++g_failed;
    std::printf("FAILED %s: %s\n", name.c_str(), failure.c_str());
  }
}

// What a scanner did with one input.
struct Outcome {
  enum Kind { kPassed, kRefused, kOther } kind;
  std::string text;  // the refusal or the other exception's text
};

Outcome outcome(const std::function<void()>& f) {
  try {
    f();
    return {Outcome::kPassed, ""};
  } catch (const Refused& e) {
    return {Outcome::kRefused, e.what()};
  } catch (const std::exception& e) {
    return {Outcome::kOther, e.what()};
  } catch (...) {
    return {Outcome::kOther, "non-std exception"};
  }
}

std::string describe(const Outcome& o) {
  switch (o.kind) {
    case Outcome::kPassed: return "it passed";
    case Outcome::kRefused: return "refused: " + o.text;
    default: return "threw something other than Refused: " + o.text;
  }
}

std::string expect_pass(const Outcome& o) { return o.kind == Outcome::kPassed ? "" : "expected to pass, " + describe(o); }

std::string expect_refused(const Outcome& o, const std::string& text) {
  if (o.kind == Outcome::kRefused && o.text.find(text) != std::string::npos) return "";
  return "expected a refusal containing \"" + text + "\", " + describe(o);
}

// ---- pickles ------------------------------------------------------------------------------------------------

using Bytes = std::string;

// A literal with its NUL bytes ("q\x00"_b): a plain literal would end at the first one.
Bytes operator""_b(const char* s, size_t n) { return Bytes(s, n); }

Outcome scan(const Bytes& b, const std::string& record = "data.pkl") {
  return outcome([&] { rai::detail::scan_pickle(record, reinterpret_cast<const uint8_t*>(b.data()), b.size()); });
}

const Bytes kProto = "\x80\x02";

Bytes u32(uint32_t v) { return Bytes(reinterpret_cast<const char*>(&v), 4); }
Bytes put(uint32_t id) { return "r" + u32(id); }  // LONG_BINPUT
Bytes get(uint32_t id) { return "j" + u32(id); }  // LONG_BINGET
Bytes unicode(const std::string& s) { return "X" + u32(static_cast<uint32_t>(s.size())) + s; }
Bytes global(const std::string& module, const std::string& name) { return "c" + module + "\n" + name + "\n"; }

// What libtorch's own pickler writes (torch.jit.save uses it for data.pkl and constants.pkl).
Bytes torch_pickle(const c10::IValue& v) {
  std::vector<at::Tensor> tensors;
  std::vector<char> out = torch::jit::pickle(v, &tensors);
  return Bytes(out.begin(), out.end());
}

c10::IValue nested_tuples(size_t levels) {
  c10::IValue v(int64_t{7});
  for (size_t i = 0; i < levels; ++i) v = c10::ivalue::Tuple::create({v});
  return v;
}

// A realistic value: dicts, lists, tuples, strings, ints (small, 2-byte, 4-byte, long), floats, bools, None,
// tensors, a shared sub-value.
c10::IValue sample_value() {
  c10::impl::GenericList list(c10::AnyType::get());
  list.push_back(int64_t{1});
  list.push_back(int64_t{300});
  list.push_back(int64_t{1} << 40);
  list.push_back(2.5);
  list.push_back(true);
  list.push_back(c10::IValue());
  list.push_back(std::string("text"));
  list.push_back(at::ones({2, 3}));
  c10::impl::GenericDict dict(c10::StringType::get(), c10::AnyType::get());
  dict.insert("list", list);
  dict.insert("again", list);  // memoized: BINPUT / BINGET
  dict.insert("tuple", c10::ivalue::Tuple::create({int64_t{1}, std::string("a"), at::zeros({4})}));
  dict.insert("ints", c10::List<int64_t>({1, 2, 3}));
  dict.insert("empty", c10::impl::GenericList(c10::AnyType::get()));
  return dict;
}

// `levels` lists, each holding the next: ] ( ] ( ] ... e e e.
Bytes nested_lists(size_t levels) {
  Bytes b = kProto + "]";
  for (size_t i = 1; i < levels; ++i) b += "(]";
  b += Bytes(levels - 1, 'e');
  return b + ".";
}

// `levels` lists, each holding the one before twice: as many paths as 2^levels, each list once.
Bytes doubling_lists(size_t levels) {
  Bytes b = kProto + "]" + put(0);
  for (uint32_t i = 1; i < levels; ++i) b += "]" + put(i) + "(" + get(i - 1) + get(i - 1) + "e";
  return b + ".";
}

void pickle_tests() {
  // Good input.
  test("pickle: None", [] { return expect_pass(scan(kProto + "N.")); });
  test("pickle: empty containers", [] { return expect_pass(scan(kProto + "(]})" + "\x87" + ".")); });
  test("pickle: libtorch's pickle of a value with dicts, lists, tuples, strings, numbers, tensors",
       [] { return expect_pass(scan(torch_pickle(sample_value()))); });
  test("pickle: libtorch's pickle of an int list and a string",
       [] { return expect_pass(scan(torch_pickle(c10::ivalue::Tuple::create({c10::List<int64_t>({1, 2}),
                                                                              std::string("x")})))); });
  test("pickle: scalars of every width (BININT1/2/4, LONG1, BINFLOAT, BINUNICODE)", [] {
    return expect_pass(scan(kProto + "(K\x01M\x01\x02J\x01\x02\x03\x04\x8a\x02\x01\x02G" + Bytes(8, '\0') +
                            unicode("abc") + "\x88\x89Nt."));
  });
  test("pickle: a dict by SETITEM and SETITEMS", [] {
    return expect_pass(scan(kProto + "}" + unicode("a") + "K\x01s" + "(" + unicode("b") + "K\x02" + unicode("c") +
                            "K\x03u."));
  });
  test("pickle: a tensor as torch.jit.save writes it (GLOBAL, BINPERSID, REDUCE)", [] {
    const Bytes storage = "(" + unicode("storage") + global("torch", "FloatStorage") + unicode("0") +
                          unicode("cpu") + "K\x04tQ";
    return expect_pass(scan(kProto + global("torch._utils", "_rebuild_tensor_v2") + "(" + storage + "K\x00"_b +
                            "K\x04\x85K\x01\x85\x89" + global("collections", "OrderedDict") + ")R" + "tR."));
  });
  test("pickle: an object of a TorchScript class (GLOBAL, EMPTY_TUPLE, NEWOBJ, BUILD)", [] {
    return expect_pass(
        scan(kProto + global("__torch__", "M") + ")\x81}(" + unicode("training") + "\x88ub."));
  });
  test("pickle: an allowed custom class (quantized packed weights)", [] {
    return expect_pass(scan(kProto + global("__torch__.torch.classes.quantized", "LinearPackedParamsBase") +
                            ")\x81N\x85" "b."));
  });
  test("pickle: bytes after STOP are not read", [] { return expect_pass(scan(kProto + "N.\xff\xff garbage")); });
  test("pickle: short memo ids (BINPUT, BINGET)", [] {
    return expect_pass(scan(kProto + "]q\x05(h\x05h\x05t."));  // a tuple holding one list twice
  });

  // Nesting: libtorch destroys values recursively, so depth is bounded; shared values are no cycles.
  test("pickle: libtorch's pickle of tuples nested kMaxPickleDepth deep passes",
       [] { return expect_pass(scan(torch_pickle(nested_tuples(kMaxPickleDepth)))); });
  test("pickle: libtorch's pickle of tuples nested one level deeper is refused", [] {
    return expect_refused(scan(torch_pickle(nested_tuples(kMaxPickleDepth + 1))),
                          "its pickle data.pkl nests values deeper than 1000 levels");
  });
  test("pickle: TUPLE1 chain at the depth bound passes",
       [] { return expect_pass(scan(kProto + "N" + Bytes(kMaxPickleDepth, '\x85') + ".")); });
  test("pickle: TUPLE1 chain one past the depth bound is refused", [] {
    return expect_refused(scan(kProto + "N" + Bytes(kMaxPickleDepth + 1, '\x85') + "."), "nests values deeper");
  });
  test("pickle: lists nested by APPENDS at the depth bound pass",
       [] { return expect_pass(scan(nested_lists(kMaxPickleDepth + 1))); });
  test("pickle: lists nested by APPENDS one past the depth bound are refused",
       [] { return expect_refused(scan(nested_lists(kMaxPickleDepth + 2)), "nests values deeper"); });
  test("pickle: 100,000 nested lists are refused without recursion", [] {
    return expect_refused(scan(nested_lists(100000)), "nests values deeper");
  });
  test("pickle: a shared value 500 levels deep (2^500 paths) passes in linear time", [] {
    const auto t0 = std::chrono::steady_clock::now();
    const std::string r = expect_pass(scan(doubling_lists(500)));
    const auto ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count();
    return !r.empty() ? r : ms > 2000 ? "took " + std::to_string(ms) + " ms" : "";
  });
  test("pickle: a shared value past the depth bound is refused",
       [] { return expect_refused(scan(doubling_lists(kMaxPickleDepth + 2)), "nests values deeper"); });

  // Cycles.
  test("pickle: a list that contains itself (BINGET of itself, APPENDS)",
       [] { return expect_refused(scan(kProto + "]q\x00(h\x00"_b "e."), "holds a value that contains itself"); });
  test("pickle: a dict that contains itself (SETITEM)", [] {
    return expect_refused(scan(kProto + "}q\x00"_b + unicode("k") + "h\x00s."_b), "contains itself");
  });
  test("pickle: a two-list cycle", [] {
    // a = []; b = [a]; a.append(b)
    return expect_refused(scan(kProto + "]" + put(1) + "]" + put(2) + "(" + get(1) + "e" + get(1) + "(" +
                                get(2) + "e."),
                          "contains itself");
  });
  test("pickle: an object whose state dict holds itself (SETITEMS, BUILD)", [] {
    return expect_refused(scan(kProto + global("__torch__", "M") + ")\x81}q\x00("_b + unicode("self") + "h\x00ub."_b),
                          "contains itself");
  });

  // Truncation and huge lengths.
  test("pickle: empty input", [] { return expect_refused(scan(""), "is malformed (truncated)"); });
  test("pickle: no STOP", [] { return expect_refused(scan(kProto + "N"), "is malformed (truncated)"); });
  test("pickle: every strict prefix of libtorch's pickle is refused, none crashes", [] {
    const Bytes b = torch_pickle(sample_value());
    for (size_t len = 0; len < b.size(); ++len) {
      const Outcome o = scan(b.substr(0, len));
      if (o.kind != Outcome::kRefused) return "prefix of " + std::to_string(len) + " bytes: " + describe(o);
    }
    return std::string();
  });
  test("pickle: every strict prefix of a tensor pickle is refused", [] {
    const Bytes b = torch_pickle(c10::ivalue::Tuple::create({at::ones({3}), std::string("name")}));
    for (size_t len = 0; len < b.size(); ++len) {
      const Outcome o = scan(b.substr(0, len));
      if (o.kind != Outcome::kRefused) return "prefix of " + std::to_string(len) + " bytes: " + describe(o);
    }
    return std::string();
  });
  test("pickle: BINUNICODE of 4 GiB - 1 bytes with 3 present",
       [] { return expect_refused(scan(kProto + "X\xff\xff\xff\xff" "abc."), "truncated"); });
  test("pickle: BINUNICODE whose length field is cut",
       [] { return expect_refused(scan(kProto + "X\x05\x00"_b), "truncated"); });
  test("pickle: LONG1 of 255 bytes with 2 present",
       [] { return expect_refused(scan(kProto + "\x8a\xff\x01\x02"), "truncated"); });
  test("pickle: BININT cut", [] { return expect_refused(scan(kProto + "J\x01\x02"), "truncated"); });
  test("pickle: BININT2 cut", [] { return expect_refused(scan(kProto + "M\x01"), "truncated"); });
  test("pickle: BININT1 cut", [] { return expect_refused(scan(kProto + "K"), "truncated"); });
  test("pickle: BINFLOAT cut", [] { return expect_refused(scan(kProto + "G\x00\x00\x00"_b), "truncated"); });
  test("pickle: PROTO without its version", [] { return expect_refused(scan("\x80"), "truncated"); });
  test("pickle: LONG_BINPUT cut", [] { return expect_refused(scan(kProto + "N" + "r\x01\x00"_b), "truncated"); });
  test("pickle: GLOBAL without a newline", [] {
    return expect_refused(scan(kProto + "ctorch._utils"), "is malformed (unterminated name)");
  });
  test("pickle: GLOBAL without its name line",
       [] { return expect_refused(scan(kProto + "ctorch._utils\n_rebuild"), "unterminated name"); });

  // Malformed structure.
  test("pickle: TUPLE1 on an empty stack", [] { return expect_refused(scan(kProto + "\x85."), "stack underflow"); });
  test("pickle: TUPLE3 with two items", [] { return expect_refused(scan(kProto + "NN\x87."), "stack underflow"); });
  test("pickle: REDUCE with one item", [] { return expect_refused(scan(kProto + "NR."), "stack underflow"); });
  test("pickle: BUILD on an empty stack", [] { return expect_refused(scan(kProto + "b."), "stack underflow"); });
  test("pickle: NEWOBJ on an empty stack", [] { return expect_refused(scan(kProto + "\x81."), "stack underflow"); });
  test("pickle: BINPERSID on an empty stack", [] { return expect_refused(scan(kProto + "Q."), "stack underflow"); });
  test("pickle: SETITEM on an empty stack", [] { return expect_refused(scan(kProto + "s."), "stack underflow"); });
  test("pickle: SETITEM with one item", [] { return expect_refused(scan(kProto + "Ns."), "stack underflow"); });
  test("pickle: SETITEM with nothing under its key and value",
       [] { return expect_refused(scan(kProto + "NNs."), "(setitem)"); });
  test("pickle: SETITEM on a scalar", [] { return expect_refused(scan(kProto + "NNNs."), "(setitem)"); });
  test("pickle: TUPLE without a MARK", [] { return expect_refused(scan(kProto + "NNt."), "(mark)"); });
  test("pickle: LIST without a MARK", [] { return expect_refused(scan(kProto + "l."), "(mark)"); });
  test("pickle: DICT without a MARK", [] { return expect_refused(scan(kProto + "d."), "(mark)"); });
  test("pickle: APPENDS without a MARK", [] { return expect_refused(scan(kProto + "]Ne."), "(mark)"); });
  test("pickle: APPENDS with nothing below its MARK", [] { return expect_refused(scan(kProto + "(Ne."), "(mark)"); });
  // A MARK left above the stack by pops below it: TUPLE2/TUPLE3 take items from under the mark.
  test("pickle: APPENDS after its MARK was popped past",
       [] { return expect_refused(scan(kProto + "]N(\x86" "e."), "(mark)"); });
  test("pickle: SETITEMS after its MARK was popped past",
       [] { return expect_refused(scan(kProto + "}NN(\x87u."), "(mark)"); });
  test("pickle: TUPLE after its MARK was popped past",
       [] { return expect_refused(scan(kProto + "NN(\x86t."), "(mark)"); });
  test("pickle: APPENDS to a scalar", [] { return expect_refused(scan(kProto + "N(Ne."), "append to a scalar"); });
  test("pickle: SETITEMS to a scalar", [] { return expect_refused(scan(kProto + "K\x01(NNu."), "append to a scalar"); });
  test("pickle: BINPUT on an empty stack", [] { return expect_refused(scan(kProto + "q\x00N."_b), "(put)"); });
  test("pickle: LONG_BINPUT on an empty stack", [] { return expect_refused(scan(kProto + put(9) + "N."), "(put)"); });
  test("pickle: BINGET of an id never put", [] { return expect_refused(scan(kProto + "h\x07."), "(get)"); });
  test("pickle: LONG_BINGET of id 2^32 - 1", [] { return expect_refused(scan(kProto + get(0xffffffffu) + "."), "(get)"); });

  // Opcodes libtorch's unpickler would run or that the scanner does not model: refused, whatever follows.
  struct Op {
    const char* name;
    Bytes code;
  };
  const Op refused_ops[] = {
      {"INST", "i"},          {"OBJ", "o"},           {"STACK_GLOBAL", "\x93"}, {"PERSID", "P"},
      {"STRING", "S"},        {"UNICODE", "V"},       {"INT", "I"},           {"LONG", "L"},
      {"FLOAT", "F"},         {"APPEND", "a"},        {"GET", "g"},           {"PUT", "p"},
      {"POP", "0"},           {"POP_MARK", "1"},      {"DUP", "2"},           {"EXT1", "\x82"},
      {"EXT2", "\x83"},       {"EXT4", "\x84"},       {"LONG4", "\x8b"},      {"BINSTRING", "T"},
      {"SHORT_BINSTRING", "U"}, {"BINBYTES", "B"},    {"SHORT_BINBYTES", "C"}, {"SHORT_BINUNICODE", "\x8c"},
      {"BINUNICODE8", "\x8d"}, {"BINBYTES8", "\x8e"}, {"EMPTY_SET", "\x8f"},  {"ADDITEMS", "\x90"},
      {"FROZENSET", "\x91"},  {"NEWOBJ_EX", "\x92"},  {"MEMOIZE", "\x94"},    {"FRAME", "\x95"},
      {"BYTEARRAY8", "\x96"}, {"NEXT_BUFFER", "\x97"}, {"READONLY_BUFFER", "\x98"}, {"NUL byte", Bytes(1, '\0')},
      {"0xff", "\xff"},
  };
  for (const auto& op : refused_ops) {
    test(std::string("pickle: opcode ") + op.name + " is refused", [&op] {
      return expect_refused(scan(kProto + "N" + op.code + "\x00\x00\x00\x00\n\n."_b), "(unsupported opcode)");
    });
  }

  // GLOBALs naming what a model may not hold.
  struct Global {
    const char* module;
    const char* name;
    const char* why;
  };
  const Global refused_globals[] = {
      {"__torch__.torch.classes._nnapi", "Compilation",
       "its data holds an object of class torch.classes._nnapi.Compilation, which loads a shared library (NNAPI)"},
      {"__torch__.torch.classes.c10d", "ProcessGroup", "does distributed communication"},
      {"__torch__.torch.classes.dist_rpc", "WorkerInfo", "makes remote calls (RPC)"},
      {"__torch__.torch.classes.profiling", "InstructionStats", "drives the process-wide TorchScript profiler"},
      {"__torch__.torch.classes.sparse", "LinearPackedParamsBase", "holds sparse weights"},
      {"__torch__.torch.classes.cuda", "Stream", "changes the process's CUDA streams"},
      {"__torch__.torch.classes.mytests", "Anything", "is not an allowed class"},
      {"__torch__.torch.classes", "quantized", "is not an allowed class"},
      {"torch._utils", "_rebuild_sparse_tensor", "its data holds a sparse tensor"},
      {"torch._utils", "_rebuild_sparse_csr_tensor", "its data holds a sparse tensor"},
      {"torch.distributed.rpc", "RRef", "its data holds a distributed object (torch.distributed.rpc.RRef)"},
      {"torch.distributed", "ProcessGroup", "its data holds a distributed object"},
  };
  for (const auto& g : refused_globals) {
    test(std::string("pickle: GLOBAL ") + g.module + "." + g.name + " is refused",
         [&g] { return expect_refused(scan(kProto + global(g.module, g.name) + ")\x81."), g.why); });
  }
  test("pickle: a refused GLOBAL deep inside a good value is found", [] {
    const Bytes good = torch_pickle(sample_value());
    // Replace the STOP by a list holding the refused object (the value before stays on the stack).
    return expect_refused(scan(good.substr(0, good.size() - 1) + "](" +
                               global("__torch__.torch.classes._nnapi", "Compilation") + ")\x81" + "e."),
                          "loads a shared library (NNAPI)");
  });
  test("pickle: the record's name is in the refusal",
       [] { return expect_refused(scan(kProto, "archive/constants.pkl"), "its pickle archive/constants.pkl is malformed"); });

  // Random damage to good pickles: each must pass or be refused, never crash or throw anything else.
  test("pickle: 20,000 randomly damaged pickles (flips, cuts, insertions) pass or are refused", [] {
    const Bytes seeds[] = {torch_pickle(sample_value()), torch_pickle(nested_tuples(50)), nested_lists(40),
                           doubling_lists(30)};
    std::mt19937_64 rng(20240923);
    size_t refused = 0;
    for (int round = 0; round < 20000; ++round) {
      Bytes b = seeds[rng() % 4];
      const int edits = 1 + rng() % 4;
      for (int e = 0; e < edits && !b.empty(); ++e) {
        const size_t at = rng() % b.size();
        switch (rng() % 4) {
          case 0: b[at] = static_cast<char>(rng()); break;
          case 1: b[at] ^= static_cast<char>(1 << (rng() % 8)); break;
          case 2: b.insert(at, 1, static_cast<char>(rng())); break;
          default: b.resize(at); break;
        }
      }
      const Outcome o = scan(b);
      if (o.kind == Outcome::kOther) return "round " + std::to_string(round) + ": " + describe(o);
      if (o.kind == Outcome::kRefused) ++refused;
    }
    std::printf("       (%zu of 20000 refused)\n", refused);
    return refused == 0 ? std::string("no damaged pickle was refused") : std::string();
  });
}

// ---- TorchScript source -------------------------------------------------------------------------------------

std::shared_ptr<torch::jit::Source> source(const std::string& text) {
  return std::make_shared<torch::jit::Source>(text);
}

Outcome depth(const std::string& text, bool script = true) {
  return outcome([&] { rai::detail::check_source_depth(source(text), script); });
}

std::string repeat(const std::string& s, size_t n) {
  std::string out;
  out.reserve(s.size() * n);
  for (size_t i = 0; i < n; ++i) out += s;
  return out;
}

std::string parens(size_t n) { return "x = " + std::string(n, '(') + "1" + std::string(n, ')') + "\n"; }

// A function with an if and `elifs` elifs.
std::string elif_chain(const std::string& name, size_t elifs) {
  std::string s = "def " + name + "(x: int) -> int:\n    if x == 0:\n        return 0\n";
  for (size_t i = 1; i <= elifs; ++i) s += "    elif x == " + std::to_string(i) + ":\n        return 1\n";
  return s + "    return 2\n";
}

// `levels` nested ifs (one space of indentation each).
std::string nested_ifs(size_t levels) {
  std::string s = "def f(x: int) -> int:\n";
  for (size_t i = 1; i <= levels; ++i) s += std::string(i, ' ') + "if x > " + std::to_string(i) + ":\n";
  return s + std::string(levels + 1, ' ') + "return x\n" + " return 0\n";
}

const char kGoodScript[] = R"(
def bar(tensors: List[Tensor], keys: List[str], args: List[str]):
    a = tensors[0]
    b = tensors[1]
    return a + b

def long_one(x: Tensor, n: int) -> Tensor:
    total = torch.zeros_like(x)
    for i in range(n):
        if i % 3 == 0:
            total = total + x * float(i)
        elif i % 3 == 1:
            total = total - torch.relu(x)
        else:
            total = torch.cat([total.unsqueeze(0), x.unsqueeze(0)], dim=0).sum(0)
    d = {"a": [1, 2, 3], "b": [4, 5, (6 + 7) * (8 - (9 // 2))]}
    s = "string with ( [ { brackets"
    return total.view(-1).reshape(x.shape)
)";

void source_tests() {
  // Good input.
  test("source: a typical script passes", [] { return expect_pass(depth(kGoodScript)); });
  test("source: a typical script passes as a model's code", [] { return expect_pass(depth(kGoodScript, false)); });
  test("source: empty", [] { return expect_pass(depth("")); });
  test("source: a megabyte of short lines", [] { return expect_pass(depth(repeat("x = (a + b) * c\n", 65536))); });
  test("source: a 100,000-digit number and a 100,000-character string", [] {
    return expect_pass(depth("x = " + std::string(100000, '7') + "\ny = '" + std::string(100000, 's') + "'\n"));
  });

  // Brackets: depth is one per bracket level, plus one for the statement, at the top level.
  test("source: parentheses nested to the bound pass",
       [] { return expect_pass(depth(parens(static_cast<size_t>(kMaxSourceDepth) - 1))); });
  test("source: parentheses nested one past the bound are refused", [] {
    return expect_refused(depth(parens(kMaxSourceDepth)), "TORCH script refused: its code nests deeper than 256 levels (line 1)");
  });
  test("source: the refusal names the line", [] {
    return expect_refused(depth("a = 1\nb = 2\n" + parens(400)), "nests deeper than 256 levels (line 3)");
  });
  test("source: a model's code is refused as a model", [] {
    return expect_refused(depth(parens(400), false), "TORCH model refused: its code nests deeper than 256 levels");
  });
  test("source: mixed brackets nested past the bound are refused", [] {
    return expect_refused(depth("x = " + repeat("[{(", 100) + "1" + repeat(")}]", 100) + "\n"), "nests deeper");
  });
  test("source: 100,000 open parentheses are refused (no recursion)",
       [] { return expect_refused(depth("x = " + std::string(100000, '(')), "nests deeper"); });
  test("source: many lines each nested just under the bound pass",
       [] { return expect_pass(depth(repeat(parens(200), 200))); });

  // Operator chains: a + b + c is a tree as deep as the chain; commas and newlines start over.
  test("source: an operator chain of 250 passes", [] { return expect_pass(depth("x = 1" + repeat(" + 1", 250) + "\n")); });
  test("source: an operator chain of 300 is refused",
       [] { return expect_refused(depth("x = 1" + repeat(" + 1", 300) + "\n"), "nests deeper"); });
  test("source: commas start a new element", [] {
    std::string element = "1" + repeat(" + 1", 200);
    std::string args = element;
    for (int i = 0; i < 50; ++i) args += ", " + element;
    return expect_pass(depth("x = f(" + args + ")\n"));
  });
  test("source: the same chain without commas is refused", [] {
    return expect_refused(depth("x = f(1" + repeat(" + 1", 300) + ")\n"), "nests deeper");
  });
  test("source: an attribute chain of 300 is refused",
       [] { return expect_refused(depth("x = a" + repeat(".b", 300) + "\n"), "nests deeper"); });
  test("source: a call chain f(1)(1)... of 300 is refused",
       [] { return expect_refused(depth("x = f" + repeat("(1)", 300) + "\n"), "nests deeper"); });
  test("source: an indexing chain a[0][0]... of 300 is refused",
       [] { return expect_refused(depth("x = a" + repeat("[0]", 300) + "\n"), "nests deeper"); });
  test("source: a unary chain of 300 minus signs is refused",
       [] { return expect_refused(depth("x = " + std::string(300, '-') + "1\n"), "nests deeper"); });

  // Statements: elif chains and indentation count twice.
  test("source: 100 elifs pass", [] { return expect_pass(depth(elif_chain("f", 100))); });
  test("source: 130 elifs are refused", [] { return expect_refused(depth(elif_chain("f", 130)), "nests deeper"); });
  test("source: a new def starts the elif count over",
       [] { return expect_pass(depth(elif_chain("f", 100) + elif_chain("g", 100) + elif_chain("h", 100))); });
  test("source: 100 nested ifs pass", [] { return expect_pass(depth(nested_ifs(100))); });
  test("source: 130 nested ifs are refused", [] { return expect_refused(depth(nested_ifs(130)), "nests deeper"); });

  // Text libtorch's lexer rejects: the lexer's error (a std::exception), never a crash.
  const std::pair<const char*, std::string> bad_text[] = {
      {"unterminated string", "x = 'abc\n"},
      {"unbalanced closing brackets", "x = 1)))))]]]}}}\n"},
      {"inconsistent dedent", "def f():\n    x = 1\n  y = 2\n"},
      {"NUL and 0xff bytes", std::string("x = 1\0\xff\xfe\n", 9)},
      {"a lone backslash", "x = \\"},
  };
  for (const auto& [what, text] : bad_text) {
    test(std::string("source: ") + what + ": no crash, nothing but std::exception", [text = text] {
      const Outcome o = depth(text);
      return o.kind == Outcome::kOther && o.text.find("non-std") != std::string::npos ? describe(o) : std::string();
    });
  }

  // class_names: the classes a model's code file defines, parsed as SourceImporter does.
  test("class names: header, imports, classes and functions", [] {
    const auto names = rai::detail::class_names(source(
        "op_version_set = 8\nimport __torch__.m\nimport torch\n"
        "class M(Module):\n  __parameters__ = []\n  training : bool\n  def forward(self: __torch__.M, x: Tensor) -> Tensor:\n    return x\n"
        "def helper(x: Tensor) -> Tensor:\n  return x\n"
        "class N(Module):\n  __parameters__ = []\n  training : bool\n"));
    return names == std::vector<std::string>{"M", "N"} ? "" : "got " + std::to_string(names.size()) + " names";
  });
  test("class names: empty file", [] {
    return rai::detail::class_names(source("")).empty() ? "" : std::string("names in an empty file");
  });
  test("class names: a top-level statement is refused", [] {
    return expect_refused(outcome([] { rai::detail::class_names(source("class M(Module):\n  training : bool\nx = 1\n")); }),
                          "TORCH model refused: its code has an unexpected top-level statement");
  });
  test("class names: a truncated class is the parser's error, not a crash", [] {
    const Outcome o = outcome([] { rai::detail::class_names(source("class M(Module):\n")); });
    return o.kind == Outcome::kOther && o.text.find("non-std") == std::string::npos ? "" : describe(o);
  });
  test("class names: a header without its number is the parser's error", [] {
    const Outcome o = outcome([] { rai::detail::class_names(source("op_version_set = \n")); });
    return o.kind == Outcome::kOther && o.text.find("non-std") == std::string::npos ? "" : describe(o);
  });
}

}  // namespace

// The policy's type walk fails closed: a kind nested past its depth bound still counts (it used to be let
// through, so `str()` of an object inside 33 nested lists printed its address).
void type_walk_tests() {
  auto nested = [](c10::TypePtr t, int levels) {
    for (int i = 0; i < levels; ++i) t = c10::ListType::create(t);
    return t;
  };
  const c10::TypePtr future = c10::FutureType::create(c10::IntType::get());
  for (int levels : {0, 1, 31, 32, 33, 40, 200}) {
    test("type walk: a Future inside " + std::to_string(levels) + " lists may show an address", [&] {
      return rai::detail::may_show_address(nested(future, levels)) ? "" : "let through";
    });
  }
  for (int levels : {0, 1, 20, 32}) {
    test("type walk: ints inside " + std::to_string(levels) + " lists show none", [&] {
      return rai::detail::may_show_address(nested(c10::IntType::get(), levels)) ? "refused" : "";
    });
  }
}

// check_calls on compiled TorchScript: depth and inlined size of the call graph.
void call_graph_tests() {
  using rai::detail::kMaxCallDepth;
  // h0 calls h1 ... h(n-1), each `calls` times; f calls h0.
  auto program = [](int n, int calls) {
    std::string src;
    for (int i = n - 1; i >= 0; --i) {
      src += "def h" + std::to_string(i) + "(x: Tensor) -> Tensor:\n    return ";
      if (i == n - 1) {
        src += "x + 1\n";
        continue;
      }
      for (int k = 0; k < calls; ++k) src += (k ? " + h" : "h") + std::to_string(i + 1) + "(x)";
      src += "\n";
    }
    return src + "def f(x: Tensor) -> Tensor:\n    return h0(x)\n";
  };
  auto check = [](const std::string& src) {
    return outcome([&] {
      auto cu = std::make_shared<torch::jit::CompilationUnit>();
      cu->define(std::nullopt, src, torch::jit::nativeResolver(), nullptr);
      rai::detail::check_calls(cu->get_functions(), /*script=*/true);
    });
  };
  const int depth = static_cast<int>(kMaxCallDepth);
  test("calls: a chain as deep as the bound passes", [&] { return expect_pass(check(program(depth - 1, 1))); });
  test("calls: a chain one deeper is refused",
       [&] { return expect_refused(check(program(depth, 1)), "TORCH script refused: its calls nest deeper than 64"); });
  test("calls: a fan-out of 2^10 inlined calls passes", [&] { return expect_pass(check(program(11, 2))); });
  test("calls: a fan-out of 2^20 inlined calls is refused",
       [&] { return expect_refused(check(program(21, 2)), "nodes (the calls fan out)"); });
  test("calls: a wide fan-out of 5^8 is refused", [&] {
    return expect_refused(check(program(9, 5)), "nodes (the calls fan out)");
  });
  test("source: defs are counted", [] {
    const int n = rai::detail::check_source_depth(source("def f(x):\n  return x\nclass C:\n  def g(self):\n    pass\n"),
                                                  /*script=*/true);
    return n == 2 ? "" : "counted " + std::to_string(n);
  });
}

int main() {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // the cases' lines in order with the failure on stderr
  pickle_tests();
  source_tests();
  type_walk_tests();
  call_graph_tests();
  std::printf("\nsandbox_scan_test: %d cases, %d failed\n", g_cases, g_failed);
  if (g_failed) {
    std::fprintf(stderr, "sandbox_scan_test: FAILED (%d of %d cases)\n", g_failed, g_cases);
    return 1;
  }
  return 0;
}

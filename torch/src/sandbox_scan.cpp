// The sandbox's scanners of untrusted input (sandbox.cpp gives the overview, sections 2 and 3): a model's pickles
// walked without being run, and TorchScript source measured for nesting and read for its class names before
// libtorch parses or compiles it. Declared in sandbox_scan.h, with the limits they hold the input to.

#include "sandbox_scan.h"

#include "sandbox_policy.h"

#include <torch/csrc/jit/frontend/lexer.h>
#include <torch/csrc/jit/frontend/parser.h>
#include <torch/csrc/jit/frontend/source_range.h>
#include <torch/csrc/jit/frontend/tree_views.h>

#include <algorithm>
#include <cstring>
#include <unordered_map>
#include <utility>

namespace rai::detail {

// The opcodes torch::jit::Unpickler reads, each as it changes the stack, the marks and the memo; any other is
// refused.
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

// The estimate of sandbox_scan.h (kMaxSourceDepth) kept token by token.
int check_source_depth(const std::shared_ptr<torch::jit::Source>& src, bool script) {
  using namespace torch::jit;
  Lexer L(src);
  std::vector<int> chain = {0};
  int indent = 0, elifs = 0, sum = 0, prev = TK_NEWLINE, defs = 0;
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
      case TK_DEF:
        elifs = 0;
        ++defs;
        break;
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
  return defs;
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

}  // namespace rai::detail

// The call graph of compiled code (sandbox_calls.h): depth and inlined size, walked without recursion.

#include "sandbox_calls.h"

#include "sandbox_policy.h"

#include <torch/csrc/jit/api/function_impl.h>
#include <torch/csrc/jit/ir/ir.h>

#include <algorithm>
#include <string>
#include <unordered_map>

namespace rai::detail {
namespace {

using torch::jit::Block;
using torch::jit::Function;
using torch::jit::Node;

// The function a call node inlines to, or nullptr (an interface's method, a builtin: nothing to inline).
Function* callee(Node* n) {
  if (n->kind() == c10::prim::CallFunction) {
    auto ft = n->inputs().empty() ? nullptr : n->input(0)->type()->cast<c10::FunctionType>();
    return ft ? ft->function() : nullptr;
  }
  if (n->kind() == c10::prim::CallMethod && !n->inputs().empty()) {
    auto cls = n->input(0)->type()->cast<c10::ClassType>();
    return cls ? cls->findMethod(n->s(c10::attr::name)) : nullptr;
  }
  return nullptr;
}

struct Body {
  uint64_t nodes = 0;
  std::vector<Function*> calls;  // once per call site
};

// The nodes of `fn`'s graph (nested blocks included) and the functions it calls.
Body body_of(Function* fn) {
  Body body;
  auto* gf = torch::jit::tryToGraphFunction(*fn);
  if (!gf) return body;
  std::vector<Block*> todo = {gf->graph()->block()};
  while (!todo.empty()) {
    Block* b = todo.back();
    todo.pop_back();
    for (Node* n : b->nodes()) {
      ++body.nodes;
      if (Function* f = callee(n)) body.calls.push_back(f);
      for (Block* sb : n->blocks()) todo.push_back(sb);
    }
  }
  return body;
}

std::string who(bool script) { return script ? "TORCH script refused: " : "TORCH model refused: "; }

}  // namespace

void check_calls(const std::vector<Function*>& fns, bool script) {
  auto too_deep = [&](Function* from) {
    throw Refused(who(script) + "its calls nest deeper than " + std::to_string(kMaxCallDepth) + " functions (from '" +
                  from->qualname().qualifiedName() + "')");
  };
  struct Info {
    enum { kOnPath, kDone } state;
    uint32_t height = 1;
    uint64_t size = 0;
  };
  std::unordered_map<Function*, Info> info;
  std::unordered_map<Function*, Body> bodies;
  struct Frame {
    Function* fn;
    size_t next;
  };
  for (Function* root : fns) {
    if (info.count(root)) continue;
    std::vector<Frame> path = {{root, 0}};
    info[root] = {Info::kOnPath};
    bodies.emplace(root, body_of(root));
    while (!path.empty()) {
      Frame& top = path.back();
      const Body& body = bodies.at(top.fn);
      if (top.next < body.calls.size()) {
        Function* c = body.calls[top.next++];
        auto it = info.find(c);
        if (it == info.end()) {
          if (path.size() >= kMaxCallDepth) too_deep(path.front().fn);
          info[c] = {Info::kOnPath};
          bodies.emplace(c, body_of(c));
          path.push_back({c, 0});
        } else if (it->second.state == Info::kOnPath) {
          throw Refused(who(script) + "function '" + c->qualname().qualifiedName() +
                        "' calls itself: recursive calls are not allowed");
        }
        continue;
      }
      uint32_t height = 1;
      uint64_t size = body.nodes;
      for (Function* c : body.calls) {
        const Info& ci = info.at(c);
        height = std::max(height, ci.height + 1);
        size = ci.size > UINT64_MAX - size ? UINT64_MAX : size + ci.size;
      }
      if (height > kMaxCallDepth) too_deep(top.fn);
      if (size - body.nodes > kMaxInlinedNodes) {  // what its calls bring in; its own nodes run anyway
        throw Refused(who(script) + "function '" + top.fn->qualname().qualifiedName() +
                      "' calls functions that inline to more than " + std::to_string(kMaxInlinedNodes) +
                      " nodes (the calls fan out)");
      }
      info[top.fn] = {Info::kDone, height, size};
      path.pop_back();
    }
  }
}

}  // namespace rai::detail

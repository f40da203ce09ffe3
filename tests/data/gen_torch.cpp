// Regenerates the tiny TorchScript models (.pt) used by the flow tests, without Python:
//
//   LIBTORCH=~/.cache/redisai-rs/torch-2.13.0
//   g++ -std=c++20 -O1 -I$LIBTORCH/include -I$LIBTORCH/include/torch/csrc/api/include tests/data/gen_torch.cpp \
//       -L$LIBTORCH/lib -ltorch_cpu -lc10 -Wl,-rpath,$LIBTORCH/lib -o /tmp/gen_torch && /tmp/gen_torch tests/data
//
// Each model is a torch::jit::Module whose forward() is defined from TorchScript source and saved.
// torch_sec_*.pt are the models the backend's sandbox must refuse or bound (tests/flow/test_security_torch.py).
#include <torch/csrc/jit/frontend/resolver.h>
#include <torch/csrc/jit/frontend/sugared_value.h>
#include <torch/csrc/jit/passes/freeze_module.h>
#include <torch/csrc/jit/runtime/operator.h>
#include <torch/script.h>

#include <iostream>
#include <string>

// `torch` and `quantized` (the quantized ops) in the source of torch_quantized_linear.
struct QuantizedResolver : torch::jit::Resolver {
  std::shared_ptr<torch::jit::SugaredValue> resolveValue(const std::string& name, torch::jit::GraphFunction&,
                                                         const torch::jit::SourceRange&) override {
    if (name == "torch") return std::make_shared<torch::jit::BuiltinModule>("aten");
    if (name == "quantized") return std::make_shared<torch::jit::BuiltinModule>("quantized");
    return nullptr;
  }
  c10::TypePtr resolveType(const std::string&, const torch::jit::SourceRange&) override { return nullptr; }
};

static void save(const std::string& dir, const std::string& name, const std::string& source) {
  torch::jit::Module m(name);
  m.define(source);
  m.save(dir + "/" + name + ".pt");
}

int main(int argc, char** argv) {
  std::string dir = argc > 1 ? argv[1] : ".";
  // c = a + b (any shape, broadcasting).
  save(dir, "torch_add", "def forward(self, a, b):\n    return a + b\n");
  // Two outputs in a tuple: x + 1 and x * 2.
  save(dir, "torch_two_outputs", "def forward(self, x):\n    return x + 1, x * 2\n");
  // y = x @ W + B, x [batch, 4]; the weights of linear.onnx (tests/data/weights.py).
  save(dir, "torch_linear",
       "def forward(self, x):\n"
       "    w = torch.arange(12.0).reshape(4, 3) / 10\n"
       "    b = torch.tensor([0.5, -1.0, 2.0])\n"
       "    return x @ w + b\n");
  // Integer inputs: c = a * b + 1.
  save(dir, "torch_int", "def forward(self, a, b):\n    return a * b + 1\n");
  // Compute-heavy (for timeouts and parallel branches): 200 x (x @ x.T normalised), x [n, 256].
  save(dir, "torch_slow",
       "def forward(self, x):\n"
       "    for i in range(200):\n"
       "        x = torch.tanh(x @ x.t() @ x / 256.0)\n"
       "    return x\n");

  // ---- for tests/flow/test_security_torch.py ----
  // Reads secret.txt (the server's working directory) into a tensor: refused.
  save(dir, "torch_sec_from_file",
       "def forward(self, x):\n"
       "    return torch.from_file('secret.txt', False, 4, dtype=0) + x\n");
  // Writes pwned.pt: refused.
  save(dir, "torch_sec_save",
       "def forward(self, x):\n"
       "    torch.save(x, 'pwned.pt')\n"
       "    return x\n");
  // Never ends: stopped by MODEL_EXECUTION_TIMEOUT.
  save(dir, "torch_sec_loop",
       "def forward(self, x):\n"
       "    i = 0\n"
       "    while i >= 0:\n"
       "        i = i + 1\n"
       "    return x + i\n");
  // torch.zeros(n), n from an INT64 input: held to the memory bound.
  save(dir, "torch_sec_zeros", "def forward(self, n):\n    return torch.zeros(int(n.item()))\n");
  // Code run by torch::jit::load itself (__setstate__): a loop that never ends, a file write. Both refused
  // before anything runs.
  {
    torch::jit::Module m("torch_sec_setstate_loop");
    m.register_attribute("k", c10::IntType::get(), 1);
    m.define(
        "def forward(self, x):\n"
        "    return x\n"
        "def __getstate__(self):\n"
        "    return (self.k, 1)\n"
        "def __setstate__(self, state: Tuple[int, int]):\n"
        "    self.k = state[0]\n"
        "    i = state[1]\n"
        "    while i > 0:\n"
        "        i = i + 1\n");
    m.save(dir + "/torch_sec_setstate_loop.pt");
  }
  {
    torch::jit::Module m("torch_sec_setstate_save");
    m.register_attribute("k", c10::IntType::get(), 1);
    m.define(
        "def forward(self, x):\n"
        "    return x\n"
        "def __getstate__(self):\n"
        "    return (self.k, 1)\n"
        "def __setstate__(self, state: Tuple[int, int]):\n"
        "    self.k = state[0]\n"
        "    torch.save(state[1], 'pwned_at_load.pt')\n");
    m.save(dir + "/torch_sec_setstate_save.pt");
  }
  // Legitimate: y = x + w with w = [0, 1, 2, 3] a buffer in data.pkl (the tests patch its size and storage).
  {
    torch::jit::Module m("torch_sec_buffer");
    m.register_buffer("w", torch::arange(4, torch::kFloat));
    m.define("def forward(self, x):\n    return x + self.w\n");
    m.save(dir + "/torch_sec_buffer.pt");
  }
  // Legitimate: a quantized linear layer (packed weights: torch.classes.quantized.LinearPackedParamsBase, rebuilt
  // by its C++ __setstate__ at load). y = dequantize(linear(quantize(x, 0.05), W)) with W = I4 / 2.
  {
    torch::jit::Module m("torch_quantized_linear");
    auto w = torch::quantize_per_tensor(torch::eye(4) / 2, 0.01, 0, torch::kQInt8);
    torch::jit::Stack stack{w, c10::IValue(torch::zeros({4}))};
    auto ops = torch::jit::getAllOperatorsFor(c10::Symbol::fromQualString("quantized::linear_prepack"));
    ops.at(0)->getOperation()(stack);
    m.register_attribute("packed", stack.back().type(), stack.back());
    m.define(
        "def forward(self, x):\n"
        "    q = torch.quantize_per_tensor(x, 0.05, 64, 13)\n"
        "    y = quantized.linear(q, self.packed, 0.05, 64)\n"
        "    return torch.dequantize(y)\n",
        std::make_shared<QuantizedResolver>());
    m.save(dir + "/torch_quantized_linear.pt");
    // Frozen: the packed weights become a constant (constants.pkl), which the code is compiled against.
    torch::jit::freeze_module(m).save(dir + "/torch_quantized_frozen.pt");
  }
  std::cout << "models written to " << dir << std::endl;
  return 0;
}

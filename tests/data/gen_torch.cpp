// Regenerates the tiny TorchScript models (.pt) used by the flow tests, without Python:
//
//   LIBTORCH=~/.cache/redisai-rs/torch-2.13.0
//   g++ -std=c++20 -O1 -I$LIBTORCH/include -I$LIBTORCH/include/torch/csrc/api/include tests/data/gen_torch.cpp \
//       -L$LIBTORCH/lib -ltorch_cpu -lc10 -Wl,-rpath,$LIBTORCH/lib -o /tmp/gen_torch && /tmp/gen_torch tests/data
//
// Each model is a torch::jit::Module whose forward() is defined from TorchScript source and saved.
#include <torch/script.h>

#include <iostream>
#include <string>

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
  std::cout << "models written to " << dir << std::endl;
  return 0;
}

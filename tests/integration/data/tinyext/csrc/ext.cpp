// tinyext: Python binding for two trivial CUDA kernels (attnforge test fixture).
#include <torch/extension.h>

void add_one_launch(float* data, int64_t n);
void times_two_launch(float* data, int64_t n);

torch::Tensor add_one(torch::Tensor x) {
  TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat, "add_one: float32 CUDA tensor expected");
  auto y = x.contiguous().clone();
  add_one_launch(y.data_ptr<float>(), y.numel());
  return y;
}

torch::Tensor times_two(torch::Tensor x) {
  TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat, "times_two: float32 CUDA tensor expected");
  auto y = x.contiguous().clone();
  times_two_launch(y.data_ptr<float>(), y.numel());
  return y;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("add_one", &add_one, "x + 1 (CUDA)");
  m.def("times_two", &times_two, "x * 2 (CUDA)");
}

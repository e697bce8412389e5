// The Python binding, like upstream's csrc/flash_attn/flash_api.cpp: links against libtorch and c10
// (and c10_cuda + cudart for the CUDA build), so a torch mismatch fails at import, as it does upstream.
// ATen's Tensor and torch's pybind11 header instead of torch/extension.h (all of libtorch's C++ API) or
// ATen/ATen.h (every operator): the same binding in a quarter of the compile time, which the image and
// index tests pay on every build.
#include <ATen/core/Tensor.h>
#include <torch/csrc/utils/pybind.h>

#ifdef MINI_FA_CUDA
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>
void mini_fa_add_one(float* x, int n, cudaStream_t stream);
#endif

at::Tensor add_one(const at::Tensor& x) {
  at::Tensor y = x.contiguous().clone();
  if (y.is_cuda()) {
#ifdef MINI_FA_CUDA
    TORCH_CHECK(y.scalar_type() == at::kFloat, "add_one: float32 only");
    mini_fa_add_one(y.data_ptr<float>(), static_cast<int>(y.numel()), c10::cuda::getCurrentCUDAStream().stream());
#else
    TORCH_CHECK(false, "flash_attn_2_cuda was built without CUDA");
#endif
  } else {
    y.add_(1);
  }
  return y;
}

std::string build_info() {
#ifdef MINI_FA_CUDA
  return "cuda";
#else
  return "cpu";
#endif
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "attnforge test fixture standing in for flash-attn's compiled kernels";
  m.def("add_one", &add_one, "x + 1 in the compiled extension");
  m.def("build_info", &build_info, "cuda or cpu");
}

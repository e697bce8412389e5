// tinyext kernel B: x * 2. With -DTINYEXT_BREAK it does not compile (the compile-error test).
#include <cstdint>
#include <cuda_runtime.h>

#ifdef TINYEXT_BREAK
static_assert(false, "tinyext: deliberate compile error (TINYEXT_BREAK)");
#endif

__global__ void times_two_kernel(float* data, int64_t n) {
  int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) data[i] *= 2.0f;
}

void times_two_launch(float* data, int64_t n) {
  if (n == 0) return;
  times_two_kernel<<<static_cast<unsigned>((n + 255) / 256), 256>>>(data, n);
}

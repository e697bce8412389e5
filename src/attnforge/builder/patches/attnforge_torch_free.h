// attnforge (patch "torch-free-kernels"): what flash-attn's kernel units took from torch, without torch.
//
// The kernel units (flash_{fwd,bwd,fwd_split}_*.cu) included torch for three things: the C10_CUDA_CHECK /
// C10_CUDA_KERNEL_LAUNCH_CHECK macros, the at::PhiloxCudaState member of the params and the device-side
// at::cuda::philox::unpack. Here they get their own: one compiled kernel object then serves every torch
// release of a CUDA lane. The Philox state is attnforge's (attnforge_philox.h); the per-torch binding
// (flash_api.cpp) fills it from torch's through attnforge_torch_bridge.h.
#pragma once

#include <cstdint>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <tuple>

#include <cuda_runtime.h>

#include "attnforge_philox.h"

namespace attnforge {

// (seed, offset) for this launch; a captured state reads them through its pointers on the device.
__host__ __device__ __forceinline__ std::tuple<uint64_t, uint64_t> philox_unpack(PhiloxCudaState state) {
    if (state.captured_) {
        return std::make_tuple(static_cast<uint64_t>(*state.seed_.ptr),
                               static_cast<uint64_t>(*state.offset_.ptr + state.offset_intragraph_));
    }
    return std::make_tuple(state.seed_.val, state.offset_.val);
}

// A failed CUDA runtime call in host code: a C++ exception (Python sees a RuntimeError through pybind11).
[[noreturn]] inline void cuda_failed(cudaError_t err, const char *call, const char *file, int line) {
    throw std::runtime_error(std::string("CUDA error: ") + cudaGetErrorString(err) + " (" + call + " at " +
                             file + ":" + std::to_string(line) + ")");
}

}  // namespace attnforge

#if defined(__FILE_NAME__)
#define ATTNFORGE_SOURCE_FILE __FILE_NAME__
#else
#define ATTNFORGE_SOURCE_FILE __FILE__
#endif

#define ATTNFORGE_CUDA_CHECK(expr)                                                           \
    do {                                                                                     \
        const cudaError_t attnforge_err_ = (expr);                                           \
        if (attnforge_err_ != cudaSuccess) {                                                 \
            ::attnforge::cuda_failed(attnforge_err_, #expr, ATTNFORGE_SOURCE_FILE, __LINE__); \
        }                                                                                    \
    } while (0)

#define ATTNFORGE_KERNEL_LAUNCH_CHECK() ATTNFORGE_CUDA_CHECK(cudaGetLastError())

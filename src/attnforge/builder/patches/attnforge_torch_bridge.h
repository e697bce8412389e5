// attnforge (patch "torch-free-kernels"): the per-torch side of attnforge_torch_free.h, included by
// flash_api.cpp only. The kernel objects were compiled without torch and may have been compiled next to
// another torch release: what they read from torch's Philox state must have the layout they were built
// for. A torch that changes it fails this build here instead of producing wrong random numbers.
#pragma once

#include <cstddef>
#include <cstring>
#include <type_traits>

#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <c10/util/Exception.h>

#include "attnforge_torch_free.h"
#include "philox_unpack.cuh"

namespace attnforge {

using TorchPhilox = at::PhiloxCudaState;

static_assert(sizeof(PhiloxCudaState) == sizeof(TorchPhilox), "at::PhiloxCudaState changed size");
static_assert(alignof(PhiloxCudaState) == alignof(TorchPhilox), "at::PhiloxCudaState changed alignment");
static_assert(std::is_standard_layout<TorchPhilox>::value && std::is_trivially_copyable<TorchPhilox>::value,
              "at::PhiloxCudaState is no longer a plain struct");
static_assert(offsetof(PhiloxCudaState, seed_) == offsetof(TorchPhilox, seed_), "seed_ moved");
static_assert(offsetof(PhiloxCudaState, offset_) == offsetof(TorchPhilox, offset_), "offset_ moved");
static_assert(offsetof(PhiloxCudaState, offset_intragraph_) == offsetof(TorchPhilox, offset_intragraph_),
              "offset_intragraph_ moved");
static_assert(offsetof(PhiloxCudaState, captured_) == offsetof(TorchPhilox, captured_), "captured_ moved");
static_assert(sizeof(PhiloxCudaState::Payload) == sizeof(TorchPhilox::Payload), "Payload changed size");
static_assert(std::is_same<decltype(TorchPhilox::Payload::val), uint64_t>::value, "Payload::val changed type");
static_assert(std::is_same<decltype(TorchPhilox::Payload::ptr), int64_t *>::value, "Payload::ptr changed type");
static_assert(std::is_same<decltype(TorchPhilox::offset_intragraph_), uint64_t>::value,
              "offset_intragraph_ changed type");
static_assert(std::is_same<decltype(TorchPhilox::captured_), bool>::value, "captured_ changed type");

// torch's state as the kernels read it; outside graph capture, checked against torch's own unpack.
inline PhiloxCudaState from_torch(const TorchPhilox &state) {
    PhiloxCudaState out;
    std::memcpy(static_cast<void *>(&out), static_cast<const void *>(&state), sizeof(out));
    if (!state.captured_) {
        TORCH_CHECK(at::cuda::philox::unpack(state) == philox_unpack(out),
                    "attnforge: torch's Philox seed/offset differ from what the kernels read");
    }
    return out;
}

}  // namespace attnforge

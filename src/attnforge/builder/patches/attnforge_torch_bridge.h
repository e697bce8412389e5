// attnforge (patch "torch-free-kernels"): the per-torch side of attnforge_torch_free.h, included by
// flash_api.cpp only. The kernel objects were compiled without torch and may have been compiled next to
// another torch release: they read attnforge's own Philox state, which this binding fills from torch's
// (attnforge_philox_torch.h: member by member, with static_asserts on what the conversion relies on).
#pragma once

#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <c10/util/Exception.h>

#include "attnforge_philox_torch.h"
#include "attnforge_torch_free.h"
#include "philox_unpack.cuh"

namespace attnforge {

// torch's state as the kernels read it; outside graph capture, checked against torch's own unpack.
inline PhiloxCudaState from_torch(const at::PhiloxCudaState &state) {
    const PhiloxCudaState out = convert_philox(state);
    if (!state.captured_) {
        TORCH_CHECK(at::cuda::philox::unpack(state) == philox_unpack(out),
                    "attnforge: torch's Philox seed/offset differ from what the kernels read");
    }
    return out;
}

}  // namespace attnforge

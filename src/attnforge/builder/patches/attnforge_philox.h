// attnforge (patch "torch-free-kernels"): the Philox RNG state a flash-attn kernel launch receives, without
// torch and without CUDA (plain C++).
//
// attnforge's own layout, the same whatever torch the wheel is for: one compiled kernel object serves every
// torch release of a CUDA lane. The per-torch binding fills it from torch's at::PhiloxCudaState member by
// member (attnforge_philox_torch.h), whose layout differs between torch releases (docs/build-internals.md).
#pragma once

#include <cstdint>

namespace attnforge {

// Seed and offset as values, or as device pointers while a CUDA graph is captured, plus the offset within
// the graph.
struct PhiloxCudaState {
    union Payload {
        uint64_t val;
        int64_t *ptr;
    };
    Payload seed_{};
    Payload offset_{};
    uint64_t offset_intragraph_ = 0;  // torch <= 2.9 holds a uint32_t, torch >= 2.10 a uint64_t
    bool captured_ = false;
};

}  // namespace attnforge

// attnforge (patch "torch-free-kernels"): torch's at::PhiloxCudaState -> the kernels' attnforge::PhiloxCudaState.
//
// Plain C++ that needs one torch header, ATen/cuda/PhiloxCudaState.h (and the detail/PhiloxCudaStateRaw.cuh it
// includes): attnforge's tests compile it against those headers of every torch release the matrix names.
// torch's layout is not the kernels': torch 2.5-2.9 hold `uint32_t offset_intragraph_` (24 bytes), torch 2.10
// on `uint64_t` (32 bytes). The conversion copies member by member and relies only on what is asserted here;
// a torch that changes one of these fails the binding's build, naming it, instead of giving wrong random
// numbers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include <ATen/cuda/PhiloxCudaState.h>

#include "attnforge_philox.h"

namespace attnforge {
namespace torch_philox {

using State = at::PhiloxCudaState;
using Intragraph = decltype(State::offset_intragraph_);

// torch's struct built from the four members the conversion reads, in their own types: equal offsets and
// size mean torch's has no other member (one the conversion would drop).
struct Members {
    State::Payload seed_;
    State::Payload offset_;
    Intragraph offset_intragraph_;
    bool captured_;
};

static_assert(std::is_same<decltype(State::seed_), State::Payload>::value, "seed_ changed type");
static_assert(std::is_same<decltype(State::offset_), State::Payload>::value, "offset_ changed type");
static_assert(std::is_same<decltype(State::Payload::val), uint64_t>::value, "Payload::val changed type");
static_assert(std::is_same<decltype(State::Payload::ptr), int64_t *>::value, "Payload::ptr changed type");
static_assert(sizeof(State::Payload) == sizeof(uint64_t), "Payload changed size");
static_assert(std::is_integral<Intragraph>::value && std::is_unsigned<Intragraph>::value &&
                  !std::is_same<Intragraph, bool>::value && sizeof(Intragraph) <= sizeof(uint64_t),
              "offset_intragraph_ changed type: not an unsigned integer of at most 64 bits");
static_assert(std::is_same<decltype(State::captured_), bool>::value, "captured_ changed type");
static_assert(std::is_standard_layout<State>::value, "at::PhiloxCudaState is no longer a plain struct");
static_assert(offsetof(State, seed_) == offsetof(Members, seed_), "seed_ moved");
static_assert(offsetof(State, offset_) == offsetof(Members, offset_), "offset_ moved");
static_assert(offsetof(State, offset_intragraph_) == offsetof(Members, offset_intragraph_),
              "offset_intragraph_ moved");
static_assert(offsetof(State, captured_) == offsetof(Members, captured_), "captured_ moved");
static_assert(sizeof(State) == sizeof(Members), "at::PhiloxCudaState has a member attnforge does not convert");

}  // namespace torch_philox

// The kernels' state for torch's: the active payload member (values, or pointers while captured), the
// offset within the graph widened to 64 bits.
inline PhiloxCudaState convert_philox(const at::PhiloxCudaState &state) {
    PhiloxCudaState out;
    out.captured_ = state.captured_;
    if (state.captured_) {
        out.seed_.ptr = state.seed_.ptr;
        out.offset_.ptr = state.offset_.ptr;
    } else {
        out.seed_.val = state.seed_.val;
        out.offset_.val = state.offset_.val;
    }
    out.offset_intragraph_ = static_cast<uint64_t>(state.offset_intragraph_);
    return out;
}

}  // namespace attnforge

// attnforge: dispatch flash-attn only to the kernels this wheel was built with.
//
// Copied into csrc/flash_attn/ and included by flash_api.cpp right after static_switch.h by attnforge's
// "dispatch-subset" patch (applied at build time to the user's sdist), and by flash_api_stable.cpp (the binding
// on torch's stable ABI) by "dispatch-subset-stable". The lists come from -D flags that
// attnforge's setup hook adds to the host compiler only:
//   ATTNFORGE_HEAD_DIMS=64,128   head dims compiled (default: all six of flash-attn 2)
//   ATTNFORGE_FP16=0|1, ATTNFORGE_BF16=0|1   dtypes compiled (default: both)
// A head dim or dtype that was left out raises a RuntimeError naming what the wheel has, instead of
// failing at import with an undefined symbol. Discarded `if constexpr` branches name no kernel symbol.
#pragma once

#include <string>

// The stable-ABI binding (compiled with TORCH_TARGET_VERSION) may use torch's header-only API only:
// STD_TORCH_CHECK throws std::runtime_error and names no c10 symbol; the per-torch binding keeps TORCH_CHECK.
#ifdef TORCH_TARGET_VERSION
#include <torch/headeronly/util/Exception.h>
#define ATTNFORGE_CHECK STD_TORCH_CHECK
#else
#include <c10/util/Exception.h>
#define ATTNFORGE_CHECK TORCH_CHECK
#endif

namespace attnforge {

#ifdef ATTNFORGE_HEAD_DIMS
inline constexpr int kHeadDims[] = {ATTNFORGE_HEAD_DIMS};
#else
inline constexpr int kHeadDims[] = {32, 64, 96, 128, 192, 256};
#endif

#ifndef ATTNFORGE_FP16
#define ATTNFORGE_FP16 1
#endif
#ifndef ATTNFORGE_BF16
#define ATTNFORGE_BF16 1
#endif
inline constexpr bool kFp16 = ATTNFORGE_FP16;
inline constexpr bool kBf16 = ATTNFORGE_BF16;

constexpr bool head_dim_built(int d) {
  for (int x : kHeadDims) {
    if (x == d) { return true; }
  }
  return false;
}

inline std::string built_head_dims() {
  std::string s = "[";
  bool first = true;
  for (int x : kHeadDims) {
    if (!first) { s += ", "; }
    s += std::to_string(x);
    first = false;
  }
  return s + "]";
}

inline std::string built_dtypes() {
  std::string s = "[";
  if (kFp16) { s += "fp16"; }
  if (kFp16 && kBf16) { s += ", "; }
  if (kBf16) { s += "bf16"; }
  return s + "]";
}

inline void unsupported_head_dim(int d) {
  ATTNFORGE_CHECK(false, "this flash-attn wheel was built by attnforge with head dims ", built_head_dims(),
              " only; got ", d);
}

inline void unsupported_dtype(const char* name) {
  ATTNFORGE_CHECK(false, "this flash-attn wheel was built by attnforge with dtypes ", built_dtypes(),
              " only; got ", name);
}

}  // namespace attnforge

#define ATTNFORGE_HDIM_CASE(D, ...)                 \
  if constexpr (::attnforge::head_dim_built(D)) {   \
    constexpr static int kHeadDim = D;              \
    return __VA_ARGS__();                           \
  } else {                                          \
    ::attnforge::unsupported_head_dim(attnforge_d_); \
  }

#undef HEADDIM_SWITCH
#define HEADDIM_SWITCH(HEADDIM, ...)                                        \
  [&] {                                                                     \
    const int attnforge_d_ = (HEADDIM);                                     \
    if (attnforge_d_ <= 32) { ATTNFORGE_HDIM_CASE(32, __VA_ARGS__) }        \
    else if (attnforge_d_ <= 64) { ATTNFORGE_HDIM_CASE(64, __VA_ARGS__) }   \
    else if (attnforge_d_ <= 96) { ATTNFORGE_HDIM_CASE(96, __VA_ARGS__) }   \
    else if (attnforge_d_ <= 128) { ATTNFORGE_HDIM_CASE(128, __VA_ARGS__) } \
    else if (attnforge_d_ <= 192) { ATTNFORGE_HDIM_CASE(192, __VA_ARGS__) } \
    else if (attnforge_d_ <= 256) { ATTNFORGE_HDIM_CASE(256, __VA_ARGS__) } \
    else { ::attnforge::unsupported_head_dim(attnforge_d_); }               \
  }()

#undef FP16_SWITCH
#define FP16_SWITCH(COND, ...)                   \
  [&] {                                          \
    if (COND) {                                  \
      if constexpr (::attnforge::kFp16) {        \
        using elem_type = cutlass::half_t;       \
        return __VA_ARGS__();                    \
      } else {                                   \
        ::attnforge::unsupported_dtype("fp16");  \
      }                                          \
    } else {                                     \
      if constexpr (::attnforge::kBf16) {        \
        using elem_type = cutlass::bfloat16_t;   \
        return __VA_ARGS__();                    \
      } else {                                   \
        ::attnforge::unsupported_dtype("bf16");  \
      }                                          \
    }                                            \
  }()

// run_mha_bwd's kernel call; without backward kernels it must not name them (they are not linked).
#ifdef FLASHATTENTION_DISABLE_BACKWARD
#define ATTNFORGE_BWD_CALL(...) \
  ATTNFORGE_CHECK(false, "this flash-attn wheel was built by attnforge without backward kernels")
#else
#define ATTNFORGE_BWD_CALL(...) __VA_ARGS__
#endif

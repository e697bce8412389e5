// attnforge: dispatch flash-attn only to the kernels this wheel was built with.
//
// Copied into csrc/flash_attn/ and included by flash_api.cpp right after static_switch.h by attnforge's
// "dispatch-subset" patch (applied at build time to the user's sdist), and by flash_api_stable.cpp (the binding
// on torch's stable ABI) by "dispatch-subset-stable". The lists come from -D flags that
// attnforge's setup hook adds to the host compiler only:
//   ATTNFORGE_HEAD_DIMS=64,128   head dims compiled (default: all six of flash-attn 2)
//   ATTNFORGE_FP16=0|1, ATTNFORGE_BF16=0|1   dtypes compiled (default: both)
// A head dim, dtype or backward call that was left out raises a RuntimeError saying what the wheel holds (its
// attnforge profile, head dims, dtypes, backward) and what serves the call: the `attnforge which --head-dim D`
// (--dtype T, --backward) that names the wheel of a profile with that kernel for the user's environment, from
// the index's manifests; instead of failing at import with an undefined symbol. Discarded `if constexpr` branches name no kernel symbol. The profile's
// tag comes from attnforge_profile.h, which the setup hook writes beside this header (ATTNFORGE_PROFILE_NAME);
// without it the message says "attnforge build".
//
// The error is a std::runtime_error with exactly that message (pybind11 and torch's stable-ABI shim both raise
// it as RuntimeError): TORCH_CHECK and STD_TORCH_CHECK would add the function, the source file and the line,
// a path on the machine that built the wheel. Standard C++ only: no torch header.
#pragma once

#include <stdexcept>
#include <string>

#if defined(__has_include)
#if __has_include("attnforge_profile.h")
#include "attnforge_profile.h"
#endif
#endif

#ifndef ATTNFORGE_PROFILE_NAME
#define ATTNFORGE_PROFILE_NAME ""
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
#ifdef FLASHATTENTION_DISABLE_BACKWARD
inline constexpr bool kBackward = false;
#else
inline constexpr bool kBackward = true;
#endif

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

// "this flash-attn wheel (attnforge profile hd128: head dims [128], dtypes [fp16, bf16], forward and backward)"
inline std::string this_wheel() {
  const std::string profile = ATTNFORGE_PROFILE_NAME;
  std::string s = "this flash-attn wheel (attnforge ";
  s += profile.empty() ? std::string("build") : "profile " + profile;
  s += ": head dims " + built_head_dims() + ", dtypes " + built_dtypes();
  s += kBackward ? ", forward and backward)" : ", forward only)";
  return s;
}

// ": a wheel of a profile with <what> serves it (the full profile has all); `attnforge which <option>` names
// the one for your environment"
inline std::string served_by(const std::string& what, const std::string& option) {
  return ": a wheel of a profile with " + what + " serves it (the full profile has all); `attnforge which " +
         option + "` names the one for your environment";
}

[[noreturn]] inline void unsupported_head_dim(int d, int kernel_dim) {
  if (kernel_dim == 0) {
    throw std::runtime_error("flash-attn 2 has no kernel for head dim " + std::to_string(d) + " (at most 256)");
  }
  const std::string kernel = "head dim " + std::to_string(kernel_dim);
  const std::string bucket = d == kernel_dim ? "" : " (run by the " + kernel + " kernel)";
  throw std::runtime_error(this_wheel() + " has no kernel for head dim " + std::to_string(d) + bucket +
                           served_by(kernel, "--head-dim " + std::to_string(d)));
}

[[noreturn]] inline void unsupported_dtype(const char* name) {
  throw std::runtime_error(this_wheel() + " has no " + name + " kernels" +
                           served_by(std::string(name) + " kernels", std::string("--dtype ") + name));
}

[[noreturn]] inline void no_backward() {
  throw std::runtime_error(this_wheel() + " has no backward kernels" +
                           served_by("backward kernels", "--backward"));
}

}  // namespace attnforge

#define ATTNFORGE_HDIM_CASE(D, ...)                     \
  if constexpr (::attnforge::head_dim_built(D)) {       \
    constexpr static int kHeadDim = D;                  \
    return __VA_ARGS__();                               \
  } else {                                              \
    ::attnforge::unsupported_head_dim(attnforge_d_, D); \
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
    else { ::attnforge::unsupported_head_dim(attnforge_d_, 0); }            \
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
#define ATTNFORGE_BWD_CALL(...) ::attnforge::no_backward()
#else
#define ATTNFORGE_BWD_CALL(...) __VA_ARGS__
#endif

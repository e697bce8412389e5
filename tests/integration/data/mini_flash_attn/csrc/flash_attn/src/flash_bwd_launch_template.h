/******************************************************************************
 * Copyright (c) 2024, Tri Dao.
 ******************************************************************************/
// attnforge test fixture: the lines of upstream flash-attn 2.8.3's file that attnforge's patches edit,
// verbatim ("// [...]" marks what is left out), so the builder patches this fixture as it patches the real
// source. Not compiled: the fixture's own binding is csrc/flash_api.cpp (the fixture's setup.py says why).

#pragma once

#include "namespace_config.h"
#include <c10/cuda/CUDAException.h>  // For C10_CUDA_CHECK and C10_CUDA_KERNEL_LAUNCH_CHECK

#include "static_switch.h"
#include "hardware_info.h"
#include "flash.h"
#include "flash_bwd_preprocess_kernel.h"
#include "flash_bwd_kernel.h"

// [...]
    C10_CUDA_KERNEL_LAUNCH_CHECK();
// [...]
                            C10_CUDA_CHECK(cudaFuncSetAttribute(
                                kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_size_dq_dk_dv));
// [...]
                        C10_CUDA_KERNEL_LAUNCH_CHECK();
// [...]
        C10_CUDA_CHECK(cudaFuncSetAttribute(
            kernel_dq, cudaFuncAttributeMaxDynamicSharedMemorySize, Kernel_traits::kSmemdQSize));
// [...]
    C10_CUDA_KERNEL_LAUNCH_CHECK();
// [...]
      C10_CUDA_CHECK(status_);
// [...]
      C10_CUDA_CHECK(status_);
// [...]
      C10_CUDA_CHECK(status_);
// [...]
      C10_CUDA_CHECK(status_);
// [...]
      C10_CUDA_CHECK(status_);
// [...]
      C10_CUDA_CHECK(status_);
// [...]

/******************************************************************************
 * Copyright (c) 2024, Tri Dao.
 ******************************************************************************/
// attnforge test fixture: the lines of upstream flash-attn 2.8.3's file that attnforge's patches edit,
// verbatim ("// [...]" marks what is left out), so the builder patches this fixture as it patches the real
// source. Not compiled: the fixture's own binding is csrc/flash_api.cpp (the fixture's setup.py says why).

// Include these 2 headers instead of torch/extension.h since we don't need all of the torch headers.
#include <torch/python.h>
#include <torch/nn/functional.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <ATen/cuda/CUDAGeneratorImpl.h>  // For at::Generator and at::PhiloxCudaState
#include "philox_unpack.cuh"  // For at::cuda::philox::unpack

#include <cutlass/numeric_types.h>

#include "namespace_config.h"
#include "hardware_info.h"
#include "flash.h"
#include "static_switch.h"

// [...] mha_fwd
        params.philox_args = gen->philox_cuda_state(counter_offset);
// [...] mha_varlen_fwd
        params.philox_args = gen->philox_cuda_state(counter_offset);
// [...] mha_bwd
        params.philox_args = gen->philox_cuda_state(counter_offset);
        auto seeds = at::cuda::philox::unpack(params.philox_args);
// [...] mha_varlen_bwd
        params.philox_args = gen->philox_cuda_state(counter_offset);
        auto seeds = at::cuda::philox::unpack(params.philox_args);
// [...]

/******************************************************************************
 * Copyright (c) 2023, Tri Dao.
 ******************************************************************************/
// attnforge test fixture: the lines of upstream flash-attn 2.8.3's file that attnforge's patches edit,
// verbatim ("// [...]" marks what is left out), so the builder patches this fixture as it patches the real
// source. Not compiled: the fixture's own binding is csrc/flash_api.cpp (the fixture's setup.py says why).

#pragma once

#include "namespace_config.h"

#include <cuda.h>
#include <vector>

#include <ATen/cuda/CUDAGeneratorImpl.h> // For at::Generator and at::PhiloxCudaState

// [...]
    // Random state.
    at::PhiloxCudaState philox_args;
// [...]

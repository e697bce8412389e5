/******************************************************************************
 * Copyright (c) 2024, Tri Dao.
 ******************************************************************************/
// attnforge test fixture: the lines of upstream flash-attn 2.8.3's file that attnforge's patches edit,
// verbatim ("// [...]" marks what is left out), so the builder patches this fixture as it patches the real
// source. Not compiled: the fixture's own binding is csrc/flash_api.cpp (the fixture's setup.py says why).

#pragma once

#include "namespace_config.h"
#include "philox_unpack.cuh" // For at::cuda::philox::unpack

// [...]
    auto seed_offset = at::cuda::philox::unpack(params.philox_args);
// [...]

// attnforge test fixture: the lines of upstream flash-attn 2.8.3's file that attnforge's patches edit,
// verbatim ("// [...]" marks what is left out), so the builder patches this fixture as it patches the real
// source. Not compiled: the fixture's own binding is csrc/flash_api.cpp (the fixture's setup.py says why).

// This is purely so that it works with torch 2.1. For torch 2.2+ we can include ATen/cuda/PhiloxUtils.cuh

#pragma once
#include <ATen/cuda/detail/UnpackRaw.cuh>

"""The ROCm lane: build environments for the CK and Triton backends, the Triton wheel, AMD device helpers.

See docs/rocm.md for what ran for real and what never ran on AMD hardware or a ROCm toolchain.
"""

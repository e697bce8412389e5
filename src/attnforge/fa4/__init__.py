"""FlashAttention-4 (``flash-attn-4``, CuTe DSL) ahead of time: calls declared ahead of time (``declare``), the
GPU side that compiles them (``worker``, ``calls``), the wheel of FA4 cache entries (``package``), the runtime
that wheel ships (``runtime``, imported as ``attnforge_fa4``) and upstream's own tests sampled for the declared
features (``upstream_plugin``). Its pinned stack, cells and rules are the matrix's (``attnforge.matrix.fa4_*``,
matrix.yaml's ``fa4`` section). docs/fa4.md.
"""

"""FlashAttention-4 (``flash-attn-4``, CuTe DSL) ahead of time: its pinned stack and cells (``stack``), calls
declared ahead of time (``declare``), the GPU side that compiles them (``worker``, ``calls``), the wheel of
FA4 cache entries (``package``), the runtime that wheel ships (``runtime``, imported as ``attnforge_fa4``)
and upstream's own tests sampled for the declared features (``upstream_plugin``). docs/fa4.md.
"""

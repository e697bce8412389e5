"""FlexAttention kernels built ahead of time: specs (``spec``), the builder (``build``), the wheel
(``package``) and the loader that ships inside it (``runtime``, installed as ``attnforge_flex``)."""

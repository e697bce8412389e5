"""GPU kernel parity: flash-attn, FlexAttention, SDPA and a Hugging Face client against an fp32 reference.

The modules that run cases (``reference``, ``tolerance``, ``cases``, ``flash``, ``flexcases``, ``sdpa``,
``hf``, ``report``, ``runner``) need only the standard library and torch, so the runner works inside a
fresh venv on a GPU host that lacks attnforge's own dependencies. ``venv`` and ``manifest`` are used by
the ``attnforge parity`` command on the host side.
"""

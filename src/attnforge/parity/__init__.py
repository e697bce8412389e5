"""GPU kernel parity: flash-attn (FA2, FA3), FlexAttention, SDPA and a Hugging Face client against the fp32
reference (`attnforge.reference`).

The modules that run cases (`tolerance`, `cases`, `flash_tensors`, `flash`, `flash_child`, `fa3`, `fa3cases`,
`flexcases`, `sdpa`, `hf`, `upstream`, `parity_report`, `parity_run`) need only the standard library and
torch, so a run works inside a fresh venv on a GPU host that lacks attnforge's own dependencies. `venv`
makes that venv for the `attnforge parity` command on the host side; `profile` names what a wheel was
built for.
"""

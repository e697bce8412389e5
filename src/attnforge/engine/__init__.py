"""Running cells through the builder: a cell's job and spec, parallelism, sources, schedule and cost, the
backends that run the builder (`backends/`: docker, local, env), the ROCm lane (`rocm/`), the builder's base
images, the environment probe, the record of a built wheel, and the orchestrator (`run`) that skips
unchanged cells, shares kernel objects, resumes after OOM kills and finalizes each wheel.
"""

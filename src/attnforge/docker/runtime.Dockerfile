# attnforge runtime image: a CUDA runtime base + torch from its index + one attnforge flash-attn wheel
# (+ FlexAttention kernel caches when given). Built by `attnforge images build`, which assembles the context:
#   wheels/<the wheel>   manifest.json   smoke.py   flex-cache/ (possibly empty)
# and passes the pip configuration, the CA bundle and index credentials as BuildKit secrets:
#   DOCKER_BUILDKIT=1 /usr/bin/docker build -f docker/runtime.Dockerfile --network host \
#     --build-arg BASE_IMAGE=nvidia/cuda:13.0.0-runtime-ubuntu22.04 --build-arg PYTHON_VERSION=3.11 --build-arg TORCH_REQUIREMENT=torch==2.14.1 \
#     --secret id=pip_conf,src=pip.conf --secret id=ca_bundle,src=/etc/ssl/certs/ca-certificates.crt \
#     --secret id=pip_netrc,src=$HOME/.netrc -t attnforge/flash-attn:TAG CONTEXT
# No "# syntax=" line (it would pull a frontend image from Docker Hub; docker 20.10's built-in one does secrets).
#
# Stages: `python` (base + the distribution's python${PYTHON_VERSION}, shared by the others), `torchenv` (a venv with torch:
# the only stage that talks to an index, with the secrets mounted for that one step), `runtime` (python +
# the venv copied + the wheel installed offline from a bind mount). No compiler, source, pip cache, index
# URL or credential reaches a layer of `runtime`: the pip configuration itself is a secret, so the index
# address does not appear in `docker history` either (and a changing local port does not bust the cache).

ARG BASE_IMAGE=local/debian:bookworm

FROM ${BASE_IMAGE} AS python
# The wheel's Python, from the base distribution's packages: python3.11 on bookworm and jammy (universe),
# python3.12 on noble, python3.13 on trixie; another version needs a base (or PPA) that packages it.
ARG PYTHON_VERSION=3.11
ENV DEBIAN_FRONTEND=noninteractive LANG=C.UTF-8
RUN apt-get update \
 && apt-get install -y --no-install-recommends python${PYTHON_VERSION} libgomp1 \
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/archives/*.deb /var/log/apt /var/log/dpkg.log

FROM python AS torchenv
ARG PYTHON_VERSION=3.11
ARG TORCH_REQUIREMENT=torch
RUN apt-get update \
 && apt-get install -y --no-install-recommends python${PYTHON_VERSION}-venv \
 && rm -rf /var/lib/apt/lists/*
RUN --mount=type=secret,id=pip_conf --mount=type=secret,id=ca_bundle \
    --mount=type=secret,id=pip_netrc,target=/root/.netrc \
    set -eu; \
    if [ -s /run/secrets/ca_bundle ]; then \
        echo "CA bundle: given as a secret ($(wc -c < /run/secrets/ca_bundle) bytes)"; \
        export PIP_CERT=/run/secrets/ca_bundle SSL_CERT_FILE=/run/secrets/ca_bundle; \
    fi; \
    if [ -s /run/secrets/pip_conf ]; then export PIP_CONFIG_FILE=/run/secrets/pip_conf; else export PIP_CONFIG_FILE=/dev/null; fi; \
    if [ -s /root/.netrc ]; then echo "index credentials: given as a secret (netrc)"; fi; \
    python${PYTHON_VERSION} -m venv /opt/venv; \
    /opt/venv/bin/pip install --no-cache-dir --disable-pip-version-check --progress-bar off "${TORCH_REQUIREMENT}"; \
    /opt/venv/bin/python -c 'import torch; print("torch", torch.__version__)'

FROM python AS runtime
COPY --from=torchenv /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    VIRTUAL_ENV=/opt/venv \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
# The wheel comes from a bind mount of the context: installed offline, no copy of the file in a layer.
RUN --mount=type=bind,source=wheels,target=/tmp/attnforge-wheels \
    set -eu; \
    /opt/venv/bin/pip install --no-cache-dir --no-index --no-deps /tmp/attnforge-wheels/*.whl; \
    /opt/venv/bin/pip check || true
COPY manifest.json smoke.py /opt/attnforge/
COPY flex-cache/ /opt/attnforge/inductor-cache/
ENV TORCHINDUCTOR_CACHE_DIR=/opt/attnforge/inductor-cache
CMD ["python", "/opt/attnforge/smoke.py"]

"""Prebuilt container images: runtime and NGC-based images, their tags, labels, smoke test, push and pull.

Docker is driven through its CLI (`/usr/bin/docker`, BuildKit via DOCKER_BUILDKIT=1): secrets and cache
mounts need it. The registry is spoken to over the Docker Registry HTTP API v2 for tags, labels and the
rollback of a failed push.
"""

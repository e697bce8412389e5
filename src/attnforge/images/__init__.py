"""Prebuilt container images: runtime and NGC-based images, their tags, labels, smoke test, push and pull.

Docker is driven through its CLI (`core/docker_cli.py`; BuildKit for secrets and cache mounts). The registry
is spoken to over the Docker Registry HTTP API v2 for tags, labels and the rollback of a failed push.
"""

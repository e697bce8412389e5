"""Self-hosted GPU runner checks: driver, arches, Docker, disk, MAX_JOBS, a smoke run."""

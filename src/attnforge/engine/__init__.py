"""Running cells through the builder: jobs and specs, parallelism, progress, sources, and the engine that
skips unchanged cells, shares kernel objects, resumes after OOM kills and finalizes each wheel."""

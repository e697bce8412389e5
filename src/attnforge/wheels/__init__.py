"""Wheels after the build: finalize (names, torch pin, audit, manifest), static index, publish, resolver.

Modules:
- `naming`: variant and local-version names from a manifest, and parsing them back (shared with `which`).
- `manifest`: the `<wheel>.manifest.json` beside each wheel (docs/contracts.md), read and written atomically.
- `wheelio`: reading a wheel with its RECORD verified and writing one reproducibly (RECORD regenerated).
- `finalize`: `attnforge wheels finalize`.
- `index`: the static PEP 503/691/658 index, swapped in atomically under a lock.
- `serve`: `attnforge serve`, a loopback HTTP server with PEP 691 content negotiation.
- `destinations`, `publish`, `upload`: `attnforge publish --to NAME` (static or pypiserver via twine).
- `probe`, `resolver`, `doctor`: `attnforge which` and `attnforge doctor`.
"""

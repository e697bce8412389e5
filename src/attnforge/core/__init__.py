"""The shared contract every layer builds on: errors and exit codes, kernel and pin facts, arch facts,
the docker CLI; standard library only (plus packaging data read from this package, and tomli on
Python 3.10)."""

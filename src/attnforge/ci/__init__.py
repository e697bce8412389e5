"""CI generation: GitHub Actions workflows from matrix.yaml, and a cibuildwheel config per cell."""

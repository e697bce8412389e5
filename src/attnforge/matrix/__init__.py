"""The matrix: matrix.yaml's schema and loader, the compat data and rules, cells and their names, target
expansion (plan) and source pins (lock)."""

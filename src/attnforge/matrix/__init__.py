"""The matrix: matrix.yaml's schema and loader, publish destinations, the compat data and rules, cells and
their names, target expansion (`plan`), source pins (`source_lock`) and the project one command works on.
"""

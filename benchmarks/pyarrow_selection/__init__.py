"""The selection as it ran in the Dagster process before the selection job (pyarrow, f359f60), kept as a baseline.

bench_selection_speed times it against the job's policy on the same rows, and tests/dagster/test_training_set.py
checks that the SQL policy selects what it did wherever the near-duplicate rule is not involved.
"""

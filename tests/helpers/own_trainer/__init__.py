"""A second trainer and evaluator, written against the "Your own trainer" contract of docs/local-backend.md only.

Run through the graph by tests/dagster/test_own_trainer.py with `trained_checkpoint`'s and `map_report`'s
`module` config; this folder must be on PYTHONPATH (the package is `own_trainer`, as a team's would be).
"""

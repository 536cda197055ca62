"""Speed measurements: each compares the project against a baseline on the same files in the same run."""

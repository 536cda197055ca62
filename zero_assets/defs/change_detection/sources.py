"""Which source a raw key belongs to, if the index reads it (`write_source_index`'s rule): a bad key still maps to
its source (validation judges it); a source whose name cannot be a partition is reported and left out."""

from __future__ import annotations

from training_code.lib.coco import ANNOTATIONS_FILE
from training_code.lib.raw_index import IMAGE_SUFFIXES
from training_code.lib.storage import key_problem, printable_key


def source_of(key: str) -> str | None:
    """The source whose index `key` (relative to the raw root) changes, or None when the index does not read it."""
    printable = printable_key(key)
    source, _, rest = printable.partition("/")
    if not rest:
        return None
    if rest == ANNOTATIONS_FILE:
        return source if key_problem(printable) is None else None
    return source if rest.lower().endswith(IMAGE_SUFFIXES) else None


def partition_problem(source: str) -> str | None:
    """Why `source` cannot be a partition of the per-source assets, or None when it can."""
    if source == "":
        return "an empty folder name (a key starting with '/')"
    problem = key_problem(source)
    if problem:
        return problem
    if "..." in source:
        return "it contains '...', which Dagster refuses in partition keys"
    return None


MAX_PROBLEMS = 20  # lines of problems kept per tick; the rest are counted


class SourceFilter:
    """`source_of`, less sources that cannot be partitions; their keys are counted, the first MAX_PROBLEMS reported."""

    def __init__(self) -> None:
        self.problems: list[str] = []
        self.refused = 0  # keys whose top-level folder cannot be a source

    def source(self, key: str) -> str | None:
        source = source_of(key)
        if source is None:
            return None
        problem = partition_problem(source)
        if problem is None:
            return source
        self.refused += 1
        if len(self.problems) < MAX_PROBLEMS:
            self.problems.append(
                f"{printable_key(key)}: its top-level folder cannot be a source ({problem}); not indexed"
            )
        return None

    def problem_lines(self) -> list[str]:
        more = self.refused - len(self.problems)
        return self.problems + (
            [f"... and {more} more keys whose top-level folder cannot be a source"] if more > 0 else []
        )

"""`selection_speed`: the selection job's policy on 1,000,000 accepted rows, against the in-process selection before it.

The rows (benchmarks/accepted_lake: 20 sources, 0-3 boxes each, random hashes) are selected with the
default settings. The baseline is `select_rows` as `training_set` ran it in the Dagster process
(benchmarks/pyarrow_selection), handed the rows already in memory with their whole-picture hash; the
project is the job's policy as the job runs it: the tables staged (checked against their manifests),
then the policy's statements in DuckDB, 2 threads and a 2 GB memory limit. Both select the same images.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from benchmarks.pyarrow_selection.selection import SelectionPolicy as BaselinePolicy
from benchmarks.pyarrow_selection.selection import select_rows
from training_code.lib import selection_engine as selection
from training_code.lib.selection_plan import DEFAULT_POLICY, SelectionPlan, SelectionPolicy
from training_code.lib.training_set import SELECTION_SCHEMA

from .accepted_lake import accepted_lake
from .report import BenchResult

ROWS, SOURCES = 1_000_000, 20


def baseline_rows(sources: list[dict[str, str]]) -> pa.Table:
    """The accepted rows as the in-process selection read them: the selection's columns, the etag from
    the verdicts, `annotation`, and the whole-picture hash."""
    tables = []
    for entry in sources:
        folder = Path(entry["validated_uri"])
        accepted = pq.read_table(folder / "accepted.parquet")
        verdicts = pq.read_table(folder / "verdicts.parquet")
        etags = pc.take(verdicts["etag"], pc.index_in(accepted["key"], value_set=verdicts["key"]))
        whole = pc.list_element(accepted["phash"], 0)
        table = accepted.append_column("etag", etags).set_column(
            accepted.schema.get_field_index("phash"), "phash", whole
        )
        tables.append(table.select([*SELECTION_SCHEMA.names, "annotation", "phash"]))
    return pa.concat_tables(tables)


def run() -> list[BenchResult]:
    sources = accepted_lake(ROWS, SOURCES)
    rows = baseline_rows(sources)
    started = time.perf_counter()
    baseline = select_rows(rows, BaselinePolicy())
    baseline_s = time.perf_counter() - started
    with tempfile.TemporaryDirectory(prefix="zero-bench-select-") as scratch:
        plan = SelectionPlan(sources, SelectionPolicy())
        started = time.perf_counter()
        engine = selection.open_engine(Path(scratch), memory_limit_gb=2, threads=2)
        selection.stage_inputs(engine, plan, Path(scratch))
        selection.run_policy(engine, DEFAULT_POLICY.read_text(), "default")
        policy_s = time.perf_counter() - started
        selected = engine.execute("SELECT count(*) FROM decisions WHERE rule IS NULL").fetchone()[0]
        engine.close()
    if selected != baseline.selected.num_rows:
        raise RuntimeError(f"the policy selected {selected} images, the baseline {baseline.selected.num_rows}")
    return [
        BenchResult(
            "selection_speed",
            policy_s / baseline_s,
            "<=0.3",
            {"policy_s": policy_s, "baseline_s": baseline_s, "rows": ROWS, "selected": selected},
        )
    ]

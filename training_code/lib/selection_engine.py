"""The selection job's engine: a policy (an SQL file) run by DuckDB over the chosen sources' validated
tables, in bounded memory. docs/selection.md is the policy's contract."""

from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa

from .label_policy import EXCLUDED_BECAUSE
from .perceptual_hash import BITS
from .selection_plan import SelectionPlan, SelectionPolicy
from .storage import join
from .training_set import CHUNK_ROWS, POLICY, SELECTION_SCHEMA, read_manifest, write_training_set
from .validated_files import ACCEPTED_FILE, CATEGORIES_FILE, VERDICTS_FILE
from .verified_read import local_verified_copy, read_verified

# The rules whose excluded images a run lists by key; `zero-assets lineage --image KEY` explains the others.
LISTED_RULES = ("duplicate", "near_duplicate")
NEAR_DUPLICATE_RULE = "near_duplicate"  # the last rule: what it takes out of val is what moved the val share
# What a policy leaves: each table and the columns the job reads of it.
DECISION_COLUMNS = ("source", "key", "split", "rule", "reason", "copy_of")
NEAR_DUPLICATE_COLUMNS = ("cluster", "source", "key", "group", "validated_split", "outcome", "copy_of")
SELECTED_COLUMNS = tuple(name for name in SELECTION_SCHEMA.names if name != "etag")  # the job adds the etag
# The near-duplicate candidate join's bands over a view's 128 pHash+dhash bits: 6 of 21 bits in each of 2
# fixed permutations, so copies up to 6 bits apart always share one and chance candidates are few.
BAND_BITS, BANDS_PER_LAYOUT, BAND_LAYOUTS, LAYOUT_SEED = 21, 6, 2, 22
FETCH_THREADS = 8  # validated sets fetched or checked at a time
# The relations the job provides: a user's table may not take one of their names.
RESERVED_NAMES = frozenset({"accepted", "etags", "annotation_reasons", "source_caps", "source_weights", "band_masks"})


class PolicyError(RuntimeError):
    """The policy SQL failed or did not leave what the job reads; the message names the file and statement."""


def band_masks() -> tuple[list[int], list[int]]:
    """The candidate join's bands as masks of a view's pHash and difference hash (signed 64-bit)."""
    rng = np.random.default_rng(LAYOUT_SEED)
    phash_masks, dhash_masks = [], []
    for _ in range(BAND_LAYOUTS):
        order = rng.permutation(2 * BITS)
        for start in range(0, BANDS_PER_LAYOUT * BAND_BITS, BAND_BITS):
            bits = [int(bit) for bit in order[start : start + BAND_BITS]]
            phash_masks.append(_signed_mask([bit for bit in bits if bit < BITS]))
            dhash_masks.append(_signed_mask([bit - BITS for bit in bits if bit >= BITS]))
    return phash_masks, dhash_masks


def _signed_mask(bits: list[int]) -> int:
    mask = sum(1 << (BITS - 1 - bit) for bit in bits)
    return mask - (1 << BITS) if mask >= 1 << (BITS - 1) else mask


def open_engine(scratch: Path, memory_limit_gb: float | None = None, threads: int | None = None):
    """A DuckDB database on `scratch`, memory bounded (3/4 of the host's unless given), spilling there."""
    scratch.mkdir(parents=True, exist_ok=True)
    engine = duckdb.connect(str(scratch / "selection.duckdb"))
    limit = memory_limit_gb if memory_limit_gb is not None else 0.75 * host_memory_bytes() / 2**30
    engine.execute(f"SET memory_limit = '{float(limit):.3f}GiB'")
    engine.execute(f"SET temp_directory = '{_quoted(scratch / 'spill')}'")
    engine.execute("SET preserve_insertion_order = false")  # every output is ordered by its query
    if threads:
        engine.execute(f"SET threads = {int(threads)}")
    return engine


def host_memory_bytes() -> int:
    """This host's memory, or its cgroup's limit where that is lower (a container's)."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
    except OSError:
        return total
    return min(total, int(limit)) if limit.isdigit() else total


def stage_inputs(engine, plan: SelectionPlan, scratch: Path) -> list[str]:
    """Create the policy's inputs (docs/selection.md); returns every category name of the chosen sources."""

    def fetch(numbered: tuple[int, dict[str, str]]) -> tuple[Path, Path, set[str]]:
        number, entry = numbered
        uri, local = entry["validated_uri"], scratch / "inputs" / f"{number:06d}"
        accepted = local_verified_copy(join(uri, ACCEPTED_FILE), local / ACCEPTED_FILE)
        verdicts = local_verified_copy(join(uri, VERDICTS_FILE), local / VERDICTS_FILE)
        return accepted, verdicts, {c["name"] for c in json.loads(read_verified(join(uri, CATEGORIES_FILE)))}

    # Sources in parallel: each fetch or sha256 check releases the GIL.
    with ThreadPoolExecutor(FETCH_THREADS) as pool:
        fetched = list(pool.map(fetch, enumerate(plan.sources)))
    accepted_files = [accepted for accepted, _, _ in fetched]
    verdict_files = [verdicts for _, verdicts, _ in fetched]
    names = set().union(*(found for _, _, found in fetched))
    if unknown := sorted(set(plan.policy.categories) - names):
        raise ValueError(
            f"training_set config categories names {unknown}, which no chosen source has ({sorted(names)}); "
            "fix the config"
        )
    engine.execute(
        "CREATE VIEW accepted AS SELECT source, key, sha256, size, format, mode, width, height, orientation, "
        '"group", split, CAST(boxes AS DOUBLE[][]) AS boxes, CAST(category_names AS VARCHAR[]) AS category_names, '
        "annotation, CAST(phash AS BIGINT[]) AS phash, CAST(dhash AS BIGINT[]) AS dhash "
        f"FROM read_parquet({_file_list(accepted_files)}, union_by_name = true)"
    )
    # The etag each image was validated at: the job adds it to the selected rows.
    engine.execute(f"CREATE VIEW etags AS SELECT key, etag FROM read_parquet({_file_list(verdict_files)})")
    provide_settings(engine, plan.policy)
    for name, uri in sorted(plan.tables.items()):
        if not name.isidentifier() or name in RESERVED_NAMES:
            raise ValueError(f"training_set config tables: {name!r} is no SQL name of its own; rename it")
        path = local_verified_copy(uri, scratch / "tables" / f"{name}.parquet")
        engine.execute(f"CREATE VIEW {name} AS SELECT * FROM read_parquet('{_quoted(path)}')")
    return sorted(names)


def provide_settings(engine, policy: SelectionPolicy) -> None:
    """The policy's settings as the relations and variables its SQL reads (docs/selection.md)."""
    reasons = {"annotation": list(EXCLUDED_BECAUSE), "reason": list(EXCLUDED_BECAUSE.values())}
    _table(engine, "annotation_reasons", reasons)
    _table(engine, "source_caps", {"source": list(policy.source_caps), "cap": list(policy.source_caps.values())})
    weights = {"source": list(policy.source_weights), "weight": [float(w) for w in policy.source_weights.values()]}
    _table(engine, "source_weights", weights)
    phash_masks, dhash_masks = band_masks()
    bands = {"band": list(range(len(phash_masks))), "phash_mask": phash_masks, "dhash_mask": dhash_masks}
    _table(engine, "band_masks", bands)
    variables = {
        "categories": ("VARCHAR[]", list(policy.categories)),
        "negatives": ("BOOLEAN", policy.negatives),
        "max_images_per_source": ("BIGINT", policy.max_images_per_source),
        "max_images": ("BIGINT", policy.max_images),
        "near_duplicate_max_distance": ("INTEGER", policy.near_duplicate_max_distance),
        "near_duplicate_confirm_distance": ("INTEGER", policy.near_duplicate_confirm_distance),
    }
    for name, (sql_type, value) in variables.items():
        engine.execute(f"SET VARIABLE {name} = ?::{sql_type}", [value])


def _table(engine, name: str, columns: dict[str, list]) -> None:
    types = {"cap": pa.int64(), "weight": pa.float64()}  # of an empty table's columns; the rest are strings
    empty = {column: pa.array([], types.get(column, pa.string())) for column in columns}
    arrow = pa.table(columns if any(columns.values()) else empty)
    engine.register(f"{name}_input", arrow)
    engine.execute(f"CREATE TEMP TABLE {name} AS SELECT * FROM {name}_input")
    engine.unregister(f"{name}_input")


def quoted(columns) -> str:
    """Column names as an SQL list, each quoted (`group` is a keyword)."""
    return ", ".join(f'"{name}"' for name in columns)


def _file_list(paths: list[Path]) -> str:
    return "[" + ", ".join(f"'{_quoted(path)}'" for path in paths) + "]"


def _quoted(path: Path | str) -> str:
    return str(path).replace("'", "''")


def run_policy(engine, sql: str, name: str) -> None:
    """Run the policy's statements, then check it left what the job reads; a failure names the statement."""
    try:
        statements = engine.extract_statements(sql)
    except duckdb.Error as error:
        raise PolicyError(f"policy {name} does not parse: {error}") from None
    for number, statement in enumerate(statements, start=1):
        try:
            engine.execute(statement)
        except duckdb.Error as error:
            lines = [
                line for line in statement.query.splitlines() if line.strip() and not line.strip().startswith("--")
            ]
            first = " ".join(" ".join(lines).split())[:120]
            raise PolicyError(f"policy {name}, statement {number} ({first}...): {error}") from None
    left = (
        ("decisions", DECISION_COLUMNS),
        ("selected", SELECTED_COLUMNS),
        ("near_duplicates", NEAR_DUPLICATE_COLUMNS),
    )
    for table, wanted in left:
        try:
            found = {row[0] for row in engine.execute(f"DESCRIBE {table}").fetchall()}
        except duckdb.Error:
            raise PolicyError(f"policy {name} left no {table!r}; docs/selection.md says what a policy leaves") from None
        if missing := [column for column in wanted if column not in found]:
            raise PolicyError(f"policy {name}: table {table} has no column(s) {missing}; docs/selection.md")


def write_selection(engine, out: Path, plan: SelectionPlan, sql: str, categories: list[str]) -> tuple[dict, int]:
    """Write the training set the policy decided into the local folder `out`, manifest last."""
    listed = ", ".join(f"'{rule}'" for rule in LISTED_RULES)

    def rows(query: str):
        return lambda: engine.sql(query).to_arrow_reader(CHUNK_ROWS)

    # The selected images' etags alone: a join with every verdict would hold the whole lake's keys.
    engine.execute(
        "CREATE TABLE chosen AS SELECT key, etag FROM etags "
        "SEMI JOIN (SELECT key FROM decisions WHERE rule IS NULL) AS kept USING (key)"
    )
    fields = {
        "sources": source_counts(engine, plan),
        "policy": plan.policy.as_config(),
        "tables": dict(sorted(plan.tables.items())),
        "categories": sorted(plan.policy.categories or categories),
    }
    return write_training_set(
        out,
        rows(
            f"SELECT {quoted(SELECTED_COLUMNS)}, chosen.etag FROM selected LEFT JOIN chosen USING (key) "
            "ORDER BY source, key"
        ),
        rows(f"SELECT source, key, rule, reason, copy_of FROM decisions WHERE rule IN ({listed}) ORDER BY source, key"),
        fields,
        rows(f"SELECT {quoted(NEAR_DUPLICATE_COLUMNS)} FROM near_duplicates ORDER BY cluster, source, key"),
        sql,
    )


def source_counts(engine, plan: SelectionPlan) -> list[dict[str, Any]]:
    """Per chosen source: its validated set, data version, and images accepted, selected and excluded."""
    found = engine.execute(
        "SELECT source, coalesce(rule, ''), count(*) FROM decisions GROUP BY ALL ORDER BY ALL"
    ).fetchall()
    by_source: dict[str, dict[str, int]] = {}
    for source, rule, images in found:
        by_source.setdefault(source, {})[rule] = images
    counts = []
    for entry in plan.sources:
        rules = by_source.get(entry["source"], {})
        selected = rules.pop("", 0)
        counts.append(
            {
                **entry,
                "accepted": selected + sum(rules.values()),
                "selected": selected,
                "excluded": sum(rules.values()),
                "excluded_by_rule": dict(sorted(rules.items())),
            }
        )
    return counts


def explain(training_set: str, key: str, scratch: Path) -> dict[str, Any] | None:
    """The policy's decision (rule, reason, copy_of) for the accepted image `key`, recomputed; None if unknown."""
    manifest = read_manifest(training_set)
    sql = read_verified(join(training_set, POLICY)).decode()
    sources = [
        {name: entry[name] for name in ("source", "validated_uri", "data_version")} for entry in manifest["sources"]
    ]
    plan = SelectionPlan(sources, SelectionPolicy.from_config(manifest["policy"]), manifest.get("tables", {}))
    engine = open_engine(scratch)
    try:
        stage_inputs(engine, plan, scratch)
        run_policy(engine, sql, join(training_set, POLICY))
        found = engine.execute("SELECT rule, reason, copy_of FROM decisions WHERE key = ?", [key]).fetchone()
    finally:
        engine.close()
    return None if found is None else dict(zip(("rule", "reason", "copy_of"), found))

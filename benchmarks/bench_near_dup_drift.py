"""`near_dup_drift`: how far chance near-duplicates move the val share, on 400,000 random hashes in large groups.

No image copies another: every pair the policy finds is chance. Also run without the confirming hash.
"""

from __future__ import annotations

import duckdb
import numpy as np
import pyarrow as pa

from training_code.lib.selection_engine import provide_settings, run_policy
from training_code.lib.selection_plan import DEFAULT_POLICY, SelectionPolicy

from .accepted_lake import accepted_table
from .report import BenchResult

IMAGES, SEEDS = 400_000, (1, 2, 3, 4, 5)
GROUP_SIZES = (10_000, 20_000)


def grouped_rows(seed: int):
    """IMAGES accepted rows of one source in groups of GROUP_SIZES images, a tenth of the groups in val."""
    rng = np.random.default_rng(seed)
    table = accepted_table("lake", IMAGES, rng).append_column("etag", pa.array(["e"] * IMAGES))
    sizes = []
    while sum(sizes) < IMAGES:
        sizes.append(int(rng.integers(*GROUP_SIZES, endpoint=True)))
    group = np.repeat(np.arange(len(sizes)), sizes)[:IMAGES]
    val_groups = rng.permutation(len(sizes))[: max(1, round(len(sizes) / 10))]
    table = table.set_column(table.schema.get_field_index("group"), "group", pa.array(group).cast(pa.string()))
    split = pa.array(np.where(np.isin(group, val_groups), "val", "train").tolist())
    return table.set_column(table.schema.get_field_index("split"), "split", split)


def val_share_moved(rows, policy: SelectionPolicy) -> tuple[float, int]:
    """How far the policy's near-duplicate rule moved the val share, and the images it took out of val."""
    engine = duckdb.connect()
    engine.execute("SET threads = 2")
    engine.register("accepted", rows)
    provide_settings(engine, policy)
    run_policy(engine, DEFAULT_POLICY.read_text(), "default")
    before, after, left = engine.execute(
        """SELECT avg((split = 'val')::INTEGER), avg((split = 'val')::INTEGER) FILTER (rule IS NULL),
                  count(*) FILTER (rule = 'near_duplicate')
        FROM decisions WHERE rule IS NULL OR rule = 'near_duplicate'"""
    ).fetchone()
    return abs(after - before), left


def run() -> list[BenchResult]:
    confirmed, unconfirmed = [], []
    for seed in SEEDS:
        rows = grouped_rows(seed)
        confirmed.append(val_share_moved(rows, SelectionPolicy()))
        alone = rows.set_column(rows.schema.get_field_index("dhash"), "dhash", rows.column("phash"))
        unconfirmed.append(val_share_moved(alone, SelectionPolicy(near_duplicate_confirm_distance=63)))
    details = {"images": IMAGES, "seeds": len(SEEDS)}
    return [
        BenchResult(
            "near_dup_drift",
            max(moved for moved, _ in confirmed),
            "<=0.005",
            {**details, "left_val": sum(left for _, left in confirmed)},
        ),
        BenchResult(
            "near_dup_drift_unconfirmed",
            max(moved for moved, _ in unconfirmed),
            "<=0.005",
            {
                **details,
                "left_val": sum(left for _, left in unconfirmed),
                "largest_move": max(m for m, _ in unconfirmed),
            },
        ),
    ]

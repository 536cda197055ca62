r"""Select the training set: the policy, an SQL file, run by DuckDB over every chosen source's validated tables.

Processing job. `--plan` is the plan written before launch (lib/selection_plan: `plan.json`, `policy.sql`);
writes the training set to `--out` (lib/training_set), manifest last, and reports counts, val shares and
near-duplicate pictures through Dagster Pipes.
"""

from __future__ import annotations

import argparse
import logging
import tempfile
import time
from pathlib import Path
from typing import Any

import duckdb

from training_code.lib import job_env
from training_code.lib.near_duplicate_sheet import near_duplicate_metadata
from training_code.lib.selection_engine import (
    NEAR_DUPLICATE_RULE,
    open_engine,
    run_policy,
    stage_inputs,
    write_selection,
)
from training_code.lib.selection_plan import read_plan

log = logging.getLogger("zero.select")
# Dagster metadata names of the default policy's rules' counts (the rule a policy sets in `decisions`).
RULE_COUNTS = {
    "not_annotated": "not_annotated",
    "outside_categories": "outside_categories",
    "negative": "negatives_off",
    "duplicate": "duplicates_across_sources",
    "over_cap": "over_cap",
    NEAR_DUPLICATE_RULE: "near_duplicate_images_left_val",
}


def get_args_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add = parser.add_argument
    add("--plan", required=True, help="the plan folder: plan.json and policy.sql")
    add("--out", required=True, help="local folder the training set is written to")
    add("--memory-limit-gb", type=float, help="the engine's memory limit; default 3/4 of this host's")
    add("--threads", type=int, help="the engine's threads; default one per core")
    return parser


def split_shares(engine) -> dict[str, float]:
    """The val share of the selection before the near-duplicate rule (its images still in) and after."""
    val_before, total_before, val_after, total_after = engine.execute(
        f"""SELECT
            count(*) FILTER (split = 'val'), count(*),
            count(*) FILTER (split = 'val' AND rule IS NULL), count(*) FILTER (rule IS NULL)
        FROM decisions WHERE rule IS NULL OR rule = '{NEAR_DUPLICATE_RULE}'"""
    ).fetchone()
    before, after = val_before / max(total_before, 1), val_after / max(total_after, 1)
    return {
        "val_share_before": round(before, 6),
        "val_share_after": round(after, 6),
        "val_share_moved": round(after - before, 6),
    }


def report_metadata(engine, manifest: dict[str, Any], size: int, wall_s: float, raw_uri: str) -> dict[str, Any]:
    sources = manifest["sources"]
    by_rule: dict[str, int] = {}
    for source in sources:
        for rule, images in source["excluded_by_rule"].items():
            by_rule[rule] = by_rule.get(rule, 0) + images
    train, val = engine.execute(
        "SELECT count(*) FILTER (split = 'train'), count(*) FILTER (split = 'val') FROM decisions WHERE rule IS NULL"
    ).fetchone()
    metadata: dict[str, Any] = {
        "dagster/row_count": sum(s["selected"] for s in sources),
        "sources": job_env.table(
            [
                {name: s[name] for name in ("source", "accepted", "selected", "excluded", "data_version")}
                for s in sources
            ],
            types={"accepted": "int", "selected": "int", "excluded": "int"},
        ),
        "accepted": sum(s["accepted"] for s in sources),
        "excluded": sum(s["excluded"] for s in sources),
        **{name: by_rule.pop(rule, 0) for rule, name in RULE_COUNTS.items()},
        **({"excluded_by_other_rules": {"raw_value": by_rule, "type": "json"}} if by_rule else {}),
        "train": train,
        "val": val,
        **split_shares(engine),
        "categories": len(manifest["categories"]),
        "selection_bytes": size,
        "policy_sql_sha256": manifest["files"]["policy.sql"]["sha256"],
        "engine": f"duckdb {duckdb.__version__}",
        "select_wall_s": round(wall_s, 3),
        "peak_rss_mb": round((job_env.peak_rss_bytes() or 0) / 2**20, 1),
    }
    metadata.update(near_duplicate_metadata(engine, raw_uri))
    return metadata


def main(args: argparse.Namespace) -> None:
    with job_env.pipes_session() as pipes:
        started = time.perf_counter()
        plan, sql = read_plan(args.plan)
        with tempfile.TemporaryDirectory(prefix="zero-select-", dir=job_env.scratch_root()) as scratch:
            engine = open_engine(Path(scratch), args.memory_limit_gb, args.threads)
            categories = stage_inputs(engine, plan, Path(scratch))
            run_policy(engine, sql, "policy.sql of the plan")
            manifest, size = write_selection(engine, Path(args.out), plan, sql, categories)
            wall_s = time.perf_counter() - started
            metadata = report_metadata(engine, manifest, size, wall_s, plan.raw_uri)
            engine.close()
        log.info(
            "selected %d of %d accepted images of %d sources in %.1f s (val share %.4f -> %.4f)",
            *(metadata["dagster/row_count"], metadata["accepted"], len(plan.sources), wall_s),
            *(metadata["val_share_before"], metadata["val_share_after"]),
        )
        pipes.report_asset_materialization(metadata=metadata, data_version=manifest["data_version"])


if __name__ == "__main__":
    main(get_args_parser().parse_args())

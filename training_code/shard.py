"""Pack the validated image set into Arrow IPC shards per split, with a manifest written last.

    python -m training_code.shard --validated DIR --raw DIR --out DIR [--target-shard-bytes 1000000000]

A SageMaker Processing job script. The image bytes are packed as they are (augmentation happens at
read time, never here); each image's sha256 is checked against the validated set while it is packed,
so bytes that changed after validation fail the job instead of reaching training.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path

from training_code.lib import job_env
from training_code.lib.shard_format import FORMAT, MANIFEST
from training_code.lib.shard_writer import ShardWriter
from training_code.lib.hashing import sha256_bytes
from training_code.lib.storage import safe_relative_key, write_bytes_atomic
from training_code.lib.tables import ACCEPTED, SPLITS, read_table

log = logging.getLogger("zero.shard")


class ChangedAfterValidation(RuntimeError):
    """Raw bytes no longer match the sha256 recorded by validation."""


def get_args_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--validated", type=Path, required=True, help="folder with accepted.parquet and categories.json")
    parser.add_argument("--raw", type=Path, required=True, help="the raw root the validated keys are relative to")
    parser.add_argument("--out", type=Path, required=True, help="folder for the shards and manifest.json")
    parser.add_argument("--target-shard-bytes", type=int, default=1_000_000_000)
    return parser


def build_shards(validated: Path, raw: Path, out: Path, target_shard_bytes: int) -> dict:
    accepted = read_table(validated / "accepted.parquet", ACCEPTED).sort_values("key")
    categories = json.loads((validated / "categories.json").read_text())
    category_id = {c["name"]: c["id"] for c in categories}
    entries = []
    for split in SPLITS:
        rows = accepted[accepted["split"] == split]
        with ShardWriter(out, split, target_shard_bytes) as writer:
            for row in rows.itertuples(index=False):
                data = (raw / safe_relative_key(row.key)).read_bytes()
                if (digest := sha256_bytes(data)) != row.sha256:
                    raise ChangedAfterValidation(
                        f"{row.key}: sha256 is {digest} but validation recorded {row.sha256}; the raw file changed "
                        "after validation. Re-materialize validated_images, then arrow_shards."
                    )
                writer.write(
                    {
                        "image": data,
                        "image_format": row.format,
                        "width": int(row.width),
                        "height": int(row.height),
                        "boxes": [list(map(float, box)) for box in row.boxes],
                        "category_ids": [category_id[name] for name in row.category_names],
                        "category_names": list(row.category_names),
                        "source": row.source,
                        "key": row.key,
                        "sha256": row.sha256,
                    }
                )
        entries += writer.entries
    validated_manifest = (validated / MANIFEST).read_bytes()
    manifest = {
        "format": FORMAT,
        "categories": categories,
        "shards": entries,
        "rows": {split: sum(e["rows"] for e in entries if e["split"] == split) for split in SPLITS},
        "config": {"target_shard_bytes": target_shard_bytes, "image_encoding": "original"},
        "validated_manifest_sha256": sha256_bytes(validated_manifest),
    }
    write_bytes_atomic(out / MANIFEST, json.dumps(manifest, indent=1).encode())
    return manifest


def main(args: argparse.Namespace) -> None:
    with job_env.pipes_session() as pipes:
        started = time.perf_counter()
        manifest = build_shards(args.validated, args.raw, args.out, args.target_shard_bytes)
        wall = time.perf_counter() - started
        shard_bytes = sum(e["bytes"] for e in manifest["shards"])
        log.info("wrote %d shards (%d bytes) in %.1f s", len(manifest["shards"]), shard_bytes, wall)
        pipes.report_asset_materialization(
            metadata={
                "shards": len(manifest["shards"]),
                "shard_bytes": shard_bytes,
                "train_rows": manifest["rows"]["train"],
                "val_rows": manifest["rows"]["val"],
                "categories": len(manifest["categories"]),
                "pack_wall_s": round(wall, 3),
                "shard_table": job_env.md_table(
                    [{"file": e["file"], "rows": e["rows"], "bytes": e["bytes"], "sha256": e["sha256"][:16]} for e in manifest["shards"]]
                ),
            },
            data_version=sha256_bytes((args.out / MANIFEST).read_bytes()),
        )


if __name__ == "__main__":
    main(get_args_parser().parse_args())

"""The shard job packs validated images into verified Arrow IPC shards, manifest last."""

import io
import json
import subprocess
import sys
from pathlib import Path

import datasets
import pandas as pd
import pytest
from PIL import Image

from training_code.lib.hashing import sha256_bytes
from training_code.lib.shard_format import ShardIntegrityError, read_manifest, verify_shard
from training_code.lib.storage import write_bytes_atomic
from training_code.lib.tables import ACCEPTED, write_table

REPO = Path(__file__).resolve().parents[1]


def _validated_set(tmp_path: Path, images: int = 12) -> tuple[Path, Path]:
    raw, validated = tmp_path / "raw", tmp_path / "validated"
    rows = []
    for n in range(images):
        key = f"src/lot_{n % 3}/img_{n:03d}.png"
        buffer = io.BytesIO()
        Image.new("RGB", (40 + n, 30), (n * 20 % 255, 80, 160)).save(buffer, "PNG")
        (raw / key).parent.mkdir(parents=True, exist_ok=True)
        (raw / key).write_bytes(buffer.getvalue())
        rows.append(
            {"source": "src", "key": key, "sha256": sha256_bytes(buffer.getvalue()), "size": len(buffer.getvalue()),
             "format": "PNG", "mode": "RGB", "width": 40 + n, "height": 30, "orientation": 1, "group": f"src/lot_{n % 3}",
             "split": "val" if n % 3 == 0 else "train", "boxes": [[1.0, 2.0, 10.0, 12.0]], "category_names": ["washer"]}
        )
    write_table(pd.DataFrame(rows), ACCEPTED, validated / "accepted.parquet")
    (validated / "categories.json").write_text(json.dumps([{"id": 1, "name": "bolt"}, {"id": 2, "name": "washer"}]))
    write_bytes_atomic(validated / "manifest.json", b'{"format": "zero-validated/1"}')
    return raw, validated


def _run_shard_job(raw: Path, validated: Path, out: Path, target: int) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "training_code.shard", "--validated", str(validated), "--raw", str(raw), "--out", str(out),
         "--target-shard-bytes", str(target)],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )


def test_shards_roll_over_and_every_shard_opens_with_datasets(tmp_path):
    raw, validated = _validated_set(tmp_path)
    out = tmp_path / "shards"
    result = _run_shard_job(raw, validated, out, target=200)  # tiny target: one batch per shard
    assert result.returncode == 0, result.stderr
    manifest = read_manifest(out)
    assert manifest["rows"] == {"train": 8, "val": 4}
    assert [c["name"] for c in manifest["categories"]] == ["bolt", "washer"]
    for entry in manifest["shards"]:
        verify_shard(out, entry)
        dataset = datasets.Dataset.from_file(str(out / entry["file"]))
        assert len(dataset) == entry["rows"]
        assert dataset[0]["category_ids"] == [2] and dataset[0]["category_names"] == ["washer"]
    files = [e["file"] for e in manifest["shards"]]
    all_data = datasets.load_dataset("arrow", data_files=[str(out / f) for f in files], split="train")
    assert len(all_data) == 12
    assert not list(out.glob(".*.tmp")), "temporary shard files must not be left behind"


def test_bytes_changed_after_validation_fail_loudly(tmp_path):
    raw, validated = _validated_set(tmp_path, images=3)
    changed = raw / "src/lot_1/img_001.png"
    changed.write_bytes(changed.read_bytes() + b"tampered")
    result = _run_shard_job(raw, validated, tmp_path / "shards", target=1 << 30)
    assert result.returncode != 0
    assert "src/lot_1/img_001.png" in result.stderr and "changed after validation" in result.stderr
    assert not (tmp_path / "shards" / "manifest.json").exists(), "no manifest for a failed shard set"


@pytest.mark.parametrize("damage", ["truncate", "edit"])
def test_truncated_or_edited_shard_is_rejected_on_read(tmp_path, damage):
    raw, validated = _validated_set(tmp_path, images=6)
    out = tmp_path / "shards"
    assert _run_shard_job(raw, validated, out, target=1 << 30).returncode == 0
    entry = read_manifest(out)["shards"][0]
    path = out / entry["file"]
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2] if damage == "truncate" else data[:-9] + b"X" + data[-8:])
    with pytest.raises(ShardIntegrityError, match=entry["file"]):
        verify_shard(out, entry)

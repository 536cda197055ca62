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
from training_code.lib.shard_rows import Encoding
from training_code.lib.storage import write_bytes_atomic
from training_code.lib.tables import ACCEPTED, write_table
from training_code.shard import build_shards

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
            {
                "source": "src",
                "key": key,
                "sha256": sha256_bytes(buffer.getvalue()),
                "size": len(buffer.getvalue()),
                "format": "PNG",
                "mode": "RGB",
                "width": 40 + n,
                "height": 30,
                "orientation": 1,
                "group": f"src/lot_{n % 3}",
                "split": "val" if n % 3 == 0 else "train",
                "boxes": [[1.0, 2.0, 10.0, 12.0]],
                "category_names": ["washer"],
            }
        )
    write_table(pd.DataFrame(rows), ACCEPTED, validated / "accepted.parquet")
    (validated / "categories.json").write_text(json.dumps([{"id": 1, "name": "bolt"}, {"id": 2, "name": "washer"}]))
    write_bytes_atomic(validated / "manifest.json", b'{"format": "zero-validated/1"}')
    return raw, validated


def _run_shard_job(raw: Path, validated: Path, out: Path, target: int) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "training_code.shard",
            "--validated",
            str(validated),
            "--raw",
            str(raw),
            "--out",
            str(out),
            "--target-shard-bytes",
            str(target),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
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


def _build(
    raw: Path,
    validated: Path,
    out: Path,
    previous: Path | None = None,
    encoding: Encoding = Encoding(),
    target: int = 300,
):
    return build_shards(validated, raw, out, target, encoding, workers=2, previous=previous)


def test_resize_mode_scales_boxes_and_sizes_to_match_the_decoded_image(tmp_path):
    raw, validated = _validated_set(tmp_path, images=4)
    manifest, _ = _build(raw, validated, tmp_path / "shards", encoding=Encoding("resize", max_side=20, jpeg_quality=85))
    assert manifest["config"] == {
        "target_shard_bytes": 300,
        "image_encoding": "resize",
        "max_side": 20,
        "jpeg_quality": 85,
    }
    for entry in manifest["shards"]:
        for row in datasets.Dataset.from_file(str(tmp_path / "shards" / entry["file"])):
            picture = row["image"]  # datasets decodes it as decode_upright does: EXIF applied, RGB
            assert picture.size == (row["width"], row["height"]) and max(picture.size) == 20
            sx, sy = row["width"] / (40 + int(row["key"][-7:-4])), row["height"] / 30
            assert row["boxes"][0] == pytest.approx([1.0 * sx, 2.0 * sy, 10.0 * sx, 12.0 * sy], rel=1e-5)
            assert row["image_format"] == "JPEG" and row["sha256"] == sha256_bytes((raw / row["key"]).read_bytes())


def test_previous_set_is_carried_over_and_a_changed_image_rebuilds_only_its_shard(tmp_path):
    raw, validated = _validated_set(tmp_path, images=12)
    first, _ = _build(raw, validated, tmp_path / "first")
    assert len(first["shards"]) >= 4
    same, work = _build(raw, validated, tmp_path / "same", previous=tmp_path / "first")
    assert same["shards"] == first["shards"] and work["rows_packed"] == 0
    assert (tmp_path / "same" / first["shards"][0]["file"]).stat().st_ino == (
        tmp_path / "first" / first["shards"][0]["file"]
    ).stat().st_ino

    # Relabel one image: the shard holding it is dropped and its rows packed again under a new index.
    accepted = pd.read_parquet(validated / "accepted.parquet")
    changed_key = accepted.loc[accepted["split"] == "train", "key"].iloc[0]
    accepted.loc[accepted["key"] == changed_key, "boxes"] = pd.Series(
        [[[2.0, 2.0, 9.0, 9.0]]] * 1, index=accepted.index[accepted["key"] == changed_key]
    )
    write_table(accepted, ACCEPTED, validated / "accepted.parquet")
    relabelled, work = _build(raw, validated, tmp_path / "relabelled", previous=tmp_path / "first")
    holder = next(
        e
        for e in first["shards"]
        if changed_key in datasets.Dataset.from_file(str(tmp_path / "first" / e["file"]))["key"]
    )
    assert work["shards_dropped"] == 1 and work["shards_reused"] == len(first["shards"]) - 1
    assert holder not in relabelled["shards"] and work["rows_packed"] == holder["rows"]
    new_files = {e["file"] for e in relabelled["shards"]} - {e["file"] for e in first["shards"]}
    assert all(
        int(name.split("-")[1][:5])
        > max(int(e["file"].split("-")[1][:5]) for e in first["shards"] if e["split"] == "train")
        for name in new_files
    )
    assert relabelled["rows"] == first["rows"]

    # Another shard config: nothing is carried over.
    _, work = _build(raw, validated, tmp_path / "bigger", previous=tmp_path / "first", target=1 << 30)
    assert work["shards_reused"] == 0 and work["rows_packed"] == 12

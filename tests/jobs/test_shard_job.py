"""The shard job packs the selected images into verified, content-addressed Arrow IPC shards, manifest last,
and keeps an earlier set's shards by reference: changed rows masked and packed again, nothing else rewritten."""

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import datasets
import pytest
from helpers.selections import write_selection
from PIL import Image

from training_code.lib.hashing import sha256_bytes
from training_code.lib.image_encoding import Encoding
from training_code.lib.shard_format import ShardIntegrityError, masked_keys, open_shard, read_manifest, verify_shard
from training_code.lib.shard_plan import Compaction
from training_code.shard import DEFAULT_COMPACTION, build_shards

REPO = Path(__file__).resolve().parents[2]


def _rows(raw: Path, images: int = 12) -> list[dict]:
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
    return rows


def _selection(tmp_path: Path, images: int = 12) -> tuple[Path, Path]:
    raw = tmp_path / "raw"
    return raw, write_selection(tmp_path / "selection", _rows(raw, images), ["bolt", "washer"])


def _run_shard_job(raw: Path, selection: Path, out: Path, target: int) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "training_code.shard",
            "--selection",
            str(selection),
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
    raw, selection = _selection(tmp_path)
    out = tmp_path / "shards"
    result = _run_shard_job(raw, selection, out, target=200)  # tiny target: one batch per shard
    assert result.returncode == 0, result.stderr
    manifest = read_manifest(out)
    assert manifest["rows"] == {"train": 8, "val": 4} and manifest["masked_rows"] == 0
    assert [c["name"] for c in manifest["categories"]] == ["bolt", "washer"]
    for entry in manifest["shards"]:
        verify_shard(out, entry)
        name = Path(entry["path"]).name
        assert entry["path"] == f"shards/{name}" and name == f"{entry['split']}-{entry['sha256'][:16]}.arrow"
        dataset = datasets.Dataset.from_file(str(out / entry["path"]))
        assert len(dataset) == entry["rows"]
        assert dataset[0]["category_ids"] == [2] and dataset[0]["category_names"] == ["washer"]
    files = [e["path"] for e in manifest["shards"]]
    all_data = datasets.load_dataset("arrow", data_files=[str(out / f) for f in files], split="train")
    assert len(all_data) == 12
    assert not list(out.rglob(".*.tmp")), "temporary shard files must not be left behind"


@pytest.mark.parametrize("change", ["edit", "gone", "fifo"])
def test_bytes_changed_after_validation_fail_loudly(tmp_path, change):
    raw, selection = _selection(tmp_path, images=3)
    changed = raw / "src/lot_1/img_001.png"
    if change == "edit":
        changed.write_bytes(changed.read_bytes() + b"tampered")
    else:
        changed.unlink()
        if change == "fifo":  # a reader that opened it blocking would wait for a writer that never comes
            os.mkfifo(changed)
    result = _run_shard_job(raw, selection, tmp_path / "shards", target=1 << 30)
    assert result.returncode != 0
    assert "src/lot_1/img_001.png" in result.stderr and "changed after validation" in result.stderr
    assert not (tmp_path / "shards" / "manifest.json").exists(), "no manifest for a failed shard set"


@pytest.mark.parametrize("damage", ["truncate", "edit"])
def test_truncated_or_edited_shard_is_rejected_on_read(tmp_path, damage):
    raw, selection = _selection(tmp_path, images=6)
    out = tmp_path / "shards"
    assert _run_shard_job(raw, selection, out, target=1 << 30).returncode == 0
    entry = read_manifest(out)["shards"][0]
    path = out / entry["path"]
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2] if damage == "truncate" else data[:-9] + b"X" + data[-8:])
    with pytest.raises(ShardIntegrityError, match=path.name):
        verify_shard(out, entry)


def _build(
    raw: Path,
    selection: Path,
    out: Path,
    previous: Path | None = None,
    encoding: Encoding = Encoding(),
    target: int = 300,
    compaction: Compaction = DEFAULT_COMPACTION,
):
    name = previous.name if previous else None
    return build_shards(
        selection, raw, out, target, encoding, workers=2, previous=previous, previous_name=name, compaction=compaction
    )


def test_resize_mode_scales_boxes_and_sizes_to_match_the_decoded_image(tmp_path):
    raw, selection = _selection(tmp_path, images=4)
    manifest, _ = _build(raw, selection, tmp_path / "shards", encoding=Encoding("resize", max_side=20, jpeg_quality=85))
    assert {k: manifest["config"][k] for k in ("target_shard_bytes", "image_encoding", "max_side", "jpeg_quality")} == {
        "target_shard_bytes": 300,
        "image_encoding": "resize",
        "max_side": 20,
        "jpeg_quality": 85,
    }
    for entry in manifest["shards"]:
        for row in datasets.Dataset.from_file(str(tmp_path / "shards" / entry["path"])):
            picture = row["image"]  # datasets decodes it as decode_upright does: EXIF applied, RGB
            assert picture.size == (row["width"], row["height"]) and max(picture.size) == 20
            sx, sy = row["width"] / (40 + int(row["key"][-7:-4])), row["height"] / 30
            assert row["boxes"][0] == pytest.approx([1.0 * sx, 2.0 * sy, 10.0 * sx, 12.0 * sy], rel=1e-5)
            assert row["image_format"] == "JPEG" and row["sha256"] == sha256_bytes((raw / row["key"]).read_bytes())


def _keys(folder: Path, entry: dict) -> list[str]:
    return open_shard(folder / entry["path"]).column("key").to_pylist()


def test_earlier_shards_are_kept_by_reference_and_a_changed_image_is_masked_and_packed_again(tmp_path):
    raw = tmp_path / "raw"
    rows = _rows(raw, images=12)
    write_selection(tmp_path / "selection", rows, ["washer"])
    first, _ = _build(raw, tmp_path / "selection", tmp_path / "first")
    assert len(first["shards"]) >= 4
    same, work = _build(raw, tmp_path / "selection", tmp_path / "same", previous=tmp_path / "first")
    assert work["rows_packed"] == 0 and work["shards_kept"] == len(first["shards"])
    assert [e["path"] for e in same["shards"]] == [f"../first/{e['path']}" for e in first["shards"]]
    assert not list((tmp_path / "same").glob("shards/*")), "nothing copied, nothing linked: listed by reference"
    assert same["categories"] == first["categories"]

    # Relabel one image: it is masked where it was and packed again into a new shard.
    changed = next(row for row in rows if row["split"] == "train")
    changed["boxes"] = [[2.0, 2.0, 9.0, 9.0]]
    write_selection(tmp_path / "relabelled_selection", rows, ["washer"])
    quiet = Compaction(compact_masked_share=1.0)  # no compaction: the mask is what this shows
    relabelled, work = _build(
        raw, tmp_path / "relabelled_selection", tmp_path / "relabelled", previous=tmp_path / "same", compaction=quiet
    )
    holder = next(e for e in first["shards"] if changed["key"] in _keys(tmp_path / "first", e))
    assert (work["rows_masked"], work["rows_packed"], work["shards_kept"]) == (1, 1, len(first["shards"]))
    assert masked_keys(tmp_path / "relabelled", relabelled) == {f"../first/{holder['path']}": {changed["key"]}}
    new = [e for e in relabelled["shards"] if e["path"].startswith("shards/")]
    assert len(new) == 1 and _keys(tmp_path / "relabelled", new[0]) == [changed["key"]]
    packed = open_shard(tmp_path / "relabelled" / new[0]["path"]).column("boxes").to_pylist()
    assert packed == [[[2.0, 2.0, 9.0, 9.0]]]
    assert relabelled["rows"] == first["rows"] and relabelled["masked_rows"] == 1

    # Compaction past the threshold: the shard holding the masked row is packed again, the mask goes with it.
    compacted, work = _build(raw, tmp_path / "relabelled_selection", tmp_path / "compacted", tmp_path / "relabelled")
    assert work["shards_compacted"] == 1 and compacted["masked_rows"] == 0 and compacted["rows"] == first["rows"]
    assert f"../first/{holder['path']}" not in {e["path"] for e in compacted["shards"]}

    # Another shard config: nothing is kept.
    _, work = _build(raw, tmp_path / "selection", tmp_path / "bigger", previous=tmp_path / "first", target=1 << 30)
    assert work["shards_kept"] == 0 and work["rows_packed"] == 12


def test_a_new_category_keeps_every_earlier_id_and_an_older_format_is_packed_again(tmp_path):
    raw = tmp_path / "raw"
    rows = _rows(raw, images=6)
    write_selection(tmp_path / "selection", rows, ["washer"])
    first, _ = _build(raw, tmp_path / "selection", tmp_path / "first")
    rows[0]["category_names"] = ["anchor"]  # sorts before washer: ids are appended, never renumbered
    write_selection(tmp_path / "grown_selection", rows, ["anchor", "washer"])
    quiet = Compaction(compact_masked_share=1.0)
    grown, work = _build(
        raw, tmp_path / "grown_selection", tmp_path / "grown", previous=tmp_path / "first", compaction=quiet
    )
    assert grown["categories"] == [{"id": 1, "name": "washer"}, {"id": 2, "name": "anchor"}]
    assert work["rows_packed"] == 1 and work["shards_kept"] >= 1
    new = next(e for e in grown["shards"] if e["path"].startswith("shards/"))
    assert open_shard(tmp_path / "grown" / new["path"]).column("category_ids").to_pylist() == [[2]]

    manifest_path = tmp_path / "grown" / "manifest.json"
    manifest_path.write_text(json.dumps({**json.loads(manifest_path.read_text()), "format": "zero-shards/2"}))
    again, work = _build(raw, tmp_path / "grown_selection", tmp_path / "after_upgrade", previous=tmp_path / "grown")
    assert work["shards_kept"] == 0 and work["rows_packed"] == 6
    assert again["categories"] == [{"id": 1, "name": "anchor"}, {"id": 2, "name": "washer"}], "ids start afresh"

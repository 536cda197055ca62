"""A shard set is a Hugging Face dataset: each shard opens with `datasets.Dataset.from_file` as PIL
images (upright, RGB: the frame the boxes use) and ClassLabel category ids, and the folder loads with
`datasets.load_from_disk` as a DatasetDict by split, shards kept in earlier sets' folders included
(`shard_hf_remote.load_live` leaves the masked rows out)."""

import io
import subprocess
import sys
from pathlib import Path

import datasets
import pytest
from helpers.selections import write_selection
from PIL import Image

from training_code.lib import shard_hf, shard_hf_remote
from training_code.lib.hashing import sha256_bytes
from training_code.lib.output_manifest import named_files
from training_code.lib.shard_format import (
    decode_upright,
    image_bytes,
    open_shard,
    read_manifest,
    shard_path,
    shard_schema,
    verify_shard,
)
from training_code.lib.shard_plan import Compaction
from training_code.lib.shard_writer import ShardWriter
from training_code.shard import build_shards

REPO = Path(__file__).resolve().parents[2]
CATEGORIES = [{"id": 1, "name": "bolt"}, {"id": 2, "name": "hex_nut"}, {"id": 3, "name": "washer"}]


def _stored(n: int) -> tuple[bytes, str, str, int, tuple[int, int]]:
    """Image n as (bytes, format, mode, EXIF orientation, upright size): rotated JPEGs, palette and RGBA PNGs,
    the cases where a careless decode differs from the one the boxes were drawn on."""
    kind = n % 3
    buffer = io.BytesIO()
    if kind == 0:  # stored sideways, EXIF orientation 6: upright it is 30 wide, 44 + n high
        picture = Image.new("RGB", (44 + n, 30), (200, 40, 40))
        picture.paste((20, 20, 220), (0, 0, 8, 6))  # a corner patch shows a missing or wrong turn
        exif = Image.Exif()
        exif[0x0112] = 6
        picture.save(buffer, "JPEG", quality=95, exif=exif.tobytes())
        return buffer.getvalue(), "JPEG", "RGB", 6, (30, 44 + n)
    mode = "P" if kind == 1 else "RGBA"
    picture = Image.new("RGB", (36 + n, 28), (n * 20 % 255, 90, 30)).convert(mode)
    picture.save(buffer, "PNG")
    return buffer.getvalue(), "PNG", mode, 1, (36 + n, 28)


def _rows(raw: Path, images: int = 9, categories=CATEGORIES) -> list[dict]:
    names = [c["name"] for c in categories]
    rows = []
    for n in range(images):
        data, image_format, mode, orientation, (width, height) = _stored(n)
        key = f"src/lot_{n % 3}/img_{n:03d}.{image_format.lower()}"
        (raw / key).parent.mkdir(parents=True, exist_ok=True)
        (raw / key).write_bytes(data)
        boxes = [[1.0, 2.0, 10.0, 12.0], [3.0, 4.0, 20.0, 25.0]][: 1 + n % 2]
        rows.append(
            {
                "source": "src",
                "key": key,
                "sha256": sha256_bytes(data),
                "size": len(data),
                "format": image_format,
                "mode": mode,
                "width": width,
                "height": height,
                "orientation": orientation,
                "group": f"src/lot_{n % 3}",
                "split": "val" if n % 3 == 1 else "train",
                "boxes": boxes,
                "category_names": [names[(n + i) % len(names)] for i in range(len(boxes))],
            }
        )
    return rows


def _selection(tmp_path: Path, images: int = 9, categories=CATEGORIES) -> tuple[Path, Path]:
    raw = tmp_path / "raw"
    rows = _rows(raw, images, categories)
    return raw, write_selection(tmp_path / "selection", rows, [c["name"] for c in categories])


@pytest.fixture(scope="module")
def shard_set(tmp_path_factory) -> Path:
    """A shard set written by the shard job's script, as SageMaker runs it."""
    tmp_path = tmp_path_factory.mktemp("hf")
    raw, selection = _selection(tmp_path)
    out = tmp_path / "shards"
    result = subprocess.run(
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
            "2000",
        ],  # small: several shards per split
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    return out


def test_every_shard_opens_with_pil_images_and_classlabel_categories(shard_set):
    manifest = read_manifest(shard_set)
    assert len(manifest["shards"]) > 2
    seen_modes = set()
    for entry in manifest["shards"]:
        verify_shard(shard_set, entry)
        dataset = datasets.Dataset.from_file(str(shard_set / entry["path"]))
        assert isinstance(dataset[0]["image"], Image.Image)
        category = dataset.features["category_ids"].feature
        assert isinstance(category, datasets.ClassLabel)
        assert category.names == ["__background__", "bolt", "hex_nut", "washer"]
        stored = image_bytes(open_shard(shard_set / entry["path"])).to_pylist()
        for row, data in zip(dataset, stored):
            # The names the ClassLabel gives each stored id are the row's own category names.
            assert category.int2str(row["category_ids"]) == row["category_names"] and row["category_ids"]
            # The same pixels the trainer decodes: upright (EXIF applied) and RGB, the frame of the boxes.
            assert row["image"].mode == "RGB" and row["image"].size == (row["width"], row["height"])
            assert row["image"].tobytes() == decode_upright(data).tobytes()
            assert sha256_bytes(data) == row["sha256"], "original encoding: the stored bytes are the raw file's"
            seen_modes.add(Image.open(io.BytesIO(data)).mode)
    assert seen_modes == {"RGB", "P", "RGBA"}, "the fixture covers rotated JPEGs, palette and alpha PNGs"


def test_the_folder_loads_as_a_dataset_dict_by_split(shard_set):
    manifest = read_manifest(shard_set)
    loaded = datasets.load_from_disk(str(shard_set))
    assert isinstance(loaded, datasets.DatasetDict)
    assert {split: len(data) for split, data in loaded.items()} == manifest["rows"] == {"train": 6, "val": 3}
    for split, data in loaded.items():
        keys = [
            k
            for e in manifest["shards"]
            if e["split"] == split
            for k in open_shard(shard_set / e["path"]).column("key").to_pylist()
        ]
        assert data["key"] == keys, f"{split}: the split's shards, in manifest order"
        assert isinstance(data.features["category_ids"].feature, datasets.ClassLabel) and isinstance(
            data[0]["image"], Image.Image
        )
    # The manifest vouches for the loading files, so an output missing one is never marked complete.
    assert {
        "dataset_dict.json",
        "train/state.json",
        "train/dataset_info.json",
        "val/state.json",
        "val/dataset_info.json",
    } <= set(named_files(manifest, "manifest.json"))


def test_the_spelled_out_features_are_what_datasets_writes():
    names = shard_hf.class_names(CATEGORIES)
    expected = datasets.Features(
        {
            "image": datasets.Image(mode="RGB"),
            "image_format": datasets.Value("string"),
            "width": datasets.Value("int32"),
            "height": datasets.Value("int32"),
            "boxes": datasets.List(datasets.List(datasets.Value("float32"), length=4)),
            "category_ids": datasets.List(datasets.ClassLabel(names=names)),
            "category_names": datasets.List(datasets.Value("string")),
            "source": datasets.Value("string"),
            "key": datasets.Value("string"),
            "sha256": datasets.Value("string"),
            "image_id": datasets.Value("int64"),
            "objects": datasets.Sequence(
                {
                    "id": datasets.Value("int64"),
                    "area": datasets.Value("float32"),
                    "bbox": datasets.Sequence(datasets.Value("float32"), length=4),
                    "category": datasets.ClassLabel(names=names),
                }
            ),
        }
    )
    assert shard_hf.features(names) == expected.to_dict()
    schema = shard_schema(CATEGORIES)
    assert datasets.Features.from_arrow_schema(schema) == expected, (
        "every column's storage is the one its feature reads"
    )
    assert schema.remove_metadata().equals(expected.arrow_schema.remove_metadata())


@pytest.mark.parametrize(
    "categories",
    [
        [{"id": 1, "name": "bolt"}, {"id": 3, "name": "washer"}],
        [{"id": 1, "name": "bolt"}, {"id": 2, "name": "bolt"}],
        [{"id": 1, "name": "__background__"}],
    ],
)
def test_categories_that_cannot_name_a_classlabel_are_refused(categories):
    with pytest.raises(ValueError, match="category"):
        shard_hf.class_names(categories)


def test_a_row_missing_a_column_is_refused_naming_it(tmp_path):
    row = {
        "image": b"not read",
        "image_format": "PNG",
        "width": 1,
        "height": 1,
        "boxes": [],
        "category_ids": [],
        "category_names": [],
        "source": "s",
        "key": "k/1.png",
        "sha256": "0" * 64,
    }
    for column in ("image", "category_ids", "sha256"):
        with pytest.raises(ValueError, match=f"'k/1.png': column '{column}' is missing"):
            with ShardWriter(tmp_path, "train", 1 << 20, categories=CATEGORIES) as writer:
                writer.write({name: value for name, value in row.items() if name != column})
    assert not list(tmp_path.glob("*.arrow")) and not list(tmp_path.glob(".*.tmp")), (
        "nothing is left of a refused shard"
    )


def test_a_set_keeping_earlier_shards_loads_with_them_and_load_live_skips_the_masked_rows(tmp_path):
    raw = tmp_path / "raw"
    rows = _rows(raw)
    write_selection(tmp_path / "first_selection", rows, [c["name"] for c in CATEGORIES])
    first, _ = build_shards(tmp_path / "first_selection", raw, tmp_path / "first", 2000)
    # One image leaves the selection and a new category arrives: its id is appended, the earlier shards are kept.
    gone, rows = rows[0]["key"], rows[1:]
    rows[0]["category_names"] = ["zip_tie"] * len(rows[0]["boxes"])
    write_selection(tmp_path / "second_selection", rows, [c["name"] for c in CATEGORIES] + ["zip_tie"])
    second, work = build_shards(
        tmp_path / "second_selection",
        raw,
        tmp_path / "second",
        2000,
        previous=tmp_path / "first",
        previous_name="first",
        compaction=Compaction(compact_masked_share=1.0),
    )
    assert work["shards_kept"] == len(first["shards"]) and second["masked_rows"] == 2
    assert second["categories"] == CATEGORIES + [{"id": 4, "name": "zip_tie"}]
    loaded = datasets.load_from_disk(str(tmp_path / "second"))
    assert {split: len(data) for split, data in loaded.items()} == {
        split: sum(e["rows"] for e in second["shards"] if e["split"] == split) for split in ("train", "val")
    }, "every stored row of every listed shard, the ones in the earlier folder too"
    live = shard_hf_remote.load_live(tmp_path / "second")
    keys = [key for data in live.values() for key in data["key"]]
    assert sorted(keys) == sorted(row["key"] for row in rows) and gone not in keys
    assert {split: len(data) for split, data in live.items()} == second["rows"]
    for entry in second["shards"]:  # each shard names the categories it was packed with: ids never move
        names = datasets.Dataset.from_file(str(shard_path(tmp_path / "second", entry))).features["category_ids"]
        assert names.feature.names[1:4] == [c["name"] for c in CATEGORIES]
    zip_tie = next(data for data in live.values() if rows[0]["key"] in data["key"])
    row = zip_tie[zip_tie["key"].index(rows[0]["key"])]
    assert zip_tie.features["category_ids"].feature.int2str(row["category_ids"]) == row["category_names"]

"""ShardWriter: the same rows make the same shards, byte for byte, however they are handed in (one dict a
row with `write`, columns with `write_batch` in any cut, chunked, or both mixed), since a shard's name is
its content's sha256; and the packing job's column-built labels are the row-at-a-time ones."""

from __future__ import annotations

import random
from pathlib import Path

import pyarrow as pa
import pytest

from training_code.lib import training_set as ts
from training_code.lib.image_encoding import Encoding
from training_code.lib.shard_format import LABEL_SCHEMA
from training_code.lib.shard_packing import label_columns, shard_labels
from training_code.lib.shard_writer import ShardWriter

CATEGORIES = [{"id": 2, "name": "bolt"}, {"id": 3, "name": "hex_nut"}, {"id": 1, "name": "washer"}]
NAMES = [c["name"] for c in CATEGORIES]


def _rows(count: int, seed: int = 3) -> list[dict]:
    """Shard rows of varied sizes (an empty image, a 300 KB one, rows without boxes)."""
    rng = random.Random(seed)
    rows = []
    for n in range(count):
        boxes = [[rng.uniform(0, 50) for _ in range(4)] for _ in range(rng.randint(0, 3))]
        names = [rng.choice(NAMES) for _ in boxes]
        size = 0 if n == 7 else rng.choice([10, 2_000, 40_000, 300_000])
        rows.append(
            {
                "image": rng.randbytes(size),
                "image_format": "JPEG",
                "width": 100 + n,
                "height": 80,
                "boxes": boxes,
                "category_ids": [next(c["id"] for c in CATEGORIES if c["name"] == name) for name in names],
                "category_names": names,
                "source": f"src{n % 2}",
                "key": f"src{n % 2}/img_{n:04d}.jpg",
                "sha256": f"{n:064x}",
            }
        )
    return rows


def _labels(rows: list[dict]) -> pa.Table:
    return pa.Table.from_pylist([{k: v for k, v in row.items() if k != "image"} for row in rows], schema=LABEL_SCHEMA)


def _shards(folder: Path, target: int, hand_in) -> list[tuple[str, int, bytes]]:
    """Write with `hand_in(writer)`; each shard as (manifest path, rows, file bytes)."""
    with ShardWriter(folder, "train", target, categories=CATEGORIES) as writer:
        hand_in(writer)
    return [(e["path"], e["rows"], (folder / e["path"]).read_bytes()) for e in writer.entries]


def _ways(rows: list[dict]) -> dict:
    labels = _labels(rows)
    images = [row["image"] for row in rows]
    rng = random.Random(11)

    def one_by_one(writer):
        for row in rows:
            writer.write(row)

    def all_at_once(writer):
        writer.write_batch(images, labels)

    def random_cuts(writer):
        done = 0
        while done < len(rows):
            n = rng.randint(1, 90)
            writer.write_batch(pa.array(images[done : done + n], pa.binary()), labels.slice(done, n))
            done += n

    def chunked_reordered(writer):  # a chunked image column, the labels' columns in another order and types
        chunked = pa.chunked_array([pa.array(part, pa.large_binary()) for part in (images[:150], images[150:])])
        widened = labels.cast(labels.schema.set(labels.schema.get_field_index("width"), pa.field("width", pa.int64())))
        writer.write_batch(chunked, widened.select(list(reversed(widened.column_names))))

    def mixed(writer):
        for n, row in enumerate(rows):
            if n % 50 < 10:
                writer.write(row)
            else:
                writer.write_batch([row["image"]], labels.slice(n, 1))

    return {f.__name__: f for f in (one_by_one, all_at_once, random_cuts, chunked_reordered, mixed)}


@pytest.mark.parametrize("target", [700_000, 1 << 30], ids=["many-shards", "one-shard"])
def test_the_same_rows_make_the_same_shards_however_they_are_handed_in(tmp_path, target):
    rows = _rows(300)
    shards = {name: _shards(tmp_path / name, target, hand_in) for name, hand_in in _ways(rows).items()}
    reference = shards.pop("one_by_one")
    assert sum(count for _, count, _ in reference) == len(rows)
    assert (len(reference) > 20) == (target < 1 << 30), "the small target cuts many shards, the large one none"
    for name, written in shards.items():
        assert [(path, count) for path, count, _ in written] == [(path, count) for path, count, _ in reference], name
        assert [data for _, _, data in written] == [data for _, _, data in reference], name


def test_a_batch_holding_a_null_is_refused_naming_its_row_and_column(tmp_path):
    rows = _rows(5)
    labels = _labels(rows)
    sha = labels.column("sha256").to_pylist()
    sha[3] = None
    with pytest.raises(ValueError, match="'src1/img_0003.jpg': column 'sha256' is missing or None"):
        with ShardWriter(tmp_path, "train", 1 << 20, categories=CATEGORIES) as writer:
            writer.write_batch(
                [row["image"] for row in rows],
                labels.set_column(labels.schema.get_field_index("sha256"), "sha256", pa.array(sha)),
            )
    with pytest.raises(ValueError, match="'src0/img_0002.jpg': column 'image' is missing"):
        with ShardWriter(tmp_path, "train", 1 << 20, categories=CATEGORIES) as writer:
            writer.write_batch([row["image"] if n != 2 else None for n, row in enumerate(rows)], labels)
    assert not list(tmp_path.rglob("*.arrow")) and not list(tmp_path.rglob(".*.tmp")), "nothing is left of them"


def test_a_batch_of_the_wrong_shape_is_refused_naming_what(tmp_path):
    rows = _rows(4)
    labels, images = _labels(rows), [row["image"] for row in rows]
    with ShardWriter(tmp_path, "train", 1 << 20, categories=CATEGORIES) as writer:
        with pytest.raises(ValueError, match="3 images for 4 label rows"):
            writer.write_batch(images[:3], labels)
        with pytest.raises(ValueError, match="lack column 'source'"):
            writer.write_batch(images, labels.drop_columns(["source"]))
        three_values = pa.array([[[1.0, 2.0, 3.0]]] * 4, pa.list_(pa.list_(pa.float64())))
        with pytest.raises(ValueError, match="column 'boxes' .* does not convert"):
            writer.write_batch(images, labels.set_column(labels.schema.get_field_index("boxes"), "boxes", three_values))


def _selected(count: int) -> pa.Table:
    """Selection rows (SELECTION_SCHEMA) with several categories, rows without boxes, two sources."""
    rows = []
    for n, row in enumerate(_rows(count)):
        rows.append(
            {
                "source": row["source"],
                "key": row["key"],
                "sha256": row["sha256"],
                "size": len(row["image"]),
                "etag": "test",
                "format": "PNG" if n % 4 == 0 else "JPEG",
                "mode": "RGB",
                "width": row["width"],
                "height": row["height"],
                "orientation": 1 + n % 8,
                "group": f"g{n}",
                "split": "train",
                "boxes": row["boxes"],
                "category_names": row["category_names"],
            }
        )
    return pa.Table.from_pylist(rows, schema=ts.SELECTION_SCHEMA)


@pytest.mark.parametrize("encoding", [Encoding(), Encoding("resize", max_side=64)], ids=["original", "resize"])
def test_the_jobs_column_labels_are_the_row_labels(encoding):
    selected = _selected(120)
    category_id = {c["name"]: c["id"] for c in CATEGORIES}
    # A slice taken out of a larger table: its list offsets do not start at zero.
    for rows in (selected, selected.slice(37, 50), selected.take(pa.array([90, 3, 3, 57, 11]))):
        expected = pa.Table.from_pylist(
            [shard_labels(row, category_id, encoding) for row in rows.to_pylist()], schema=LABEL_SCHEMA
        )
        assert label_columns(rows, CATEGORIES, encoding).equals(expected)


def test_a_category_the_manifest_does_not_list_is_refused_naming_the_row():
    selected = _selected(10)
    with pytest.raises(ValueError, match="category 'washer' is not among the training set's categories"):
        label_columns(selected, [c for c in CATEGORIES if c["name"] != "washer"], Encoding())

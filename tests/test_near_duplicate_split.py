"""Near-duplicates never straddle the split (issue 22): re-encoded, resized and cropped copies of images,
planted in other groups and other sources, train on the side their original trains on.

The validation job runs in-process on a small raw root of demo scenes (so each hash is the one the
decode makes) and the selection's rule runs on its accepted rows; the rule also on hand-made hashes.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
from PIL import Image
from raw_index_reference import build_raw_index

from training_code.lib import training_set as ts
from training_code.lib.coco import ANNOTATIONS_FILE
from training_code.lib.near_duplicate_split import PHASH, near_duplicate_counts
from training_code.lib.raw_index import whole_root_manifest
from training_code.lib.selection import ANNOTATION, SelectionPolicy, select_rows
from training_code.lib.tables import RAW_INDEX, write_table
from training_code.lib.validation_pass import validate
from training_code.validate import get_args_parser
from zero_assets.defs.assets.near_duplicate_report import SHEET_GROUPS, near_duplicate_metadata
from zero_assets.ops.demo_scenes import render_scene

SOURCES, LOTS, PER_LOT, SIDES = ("cam_a", "cam_b"), 8, 2, (480, 360)


def jpeg(image: Image.Image, quality: int = 90) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, "JPEG", quality=quality)
    return buffer.getvalue()


def planted_copies(image: Image.Image) -> dict[str, bytes]:
    width, height = image.size
    dx, dy = round(width * 0.02), round(height * 0.02)
    return {
        "reencoded": jpeg(image, 50),
        "resized": jpeg(image.resize((width // 2, height // 2), Image.Resampling.LANCZOS), 85),
        "cropped": jpeg(image.crop((dx, dy, width - dx, height - dy)), 85),
    }


def make_root(raw: Path) -> dict[str, str]:
    """Scenes in every lot of both sources; each of the first lots' first scenes copied three ways into
    lots further on, alternately of the other source and its own. Returns copy key -> original key."""
    files: dict[str, bytes] = {}
    originals: dict[str, Image.Image] = {}
    for s, source in enumerate(SOURCES):
        for lot in range(LOTS):
            for n in range(PER_LOT):
                image = render_scene(np.random.default_rng(1000 * s + 10 * lot + n), *SIDES)[0].convert("RGB")
                key = f"{source}/lot_{lot}/scene_{n}.jpg"
                files[key] = jpeg(image)
                originals[key] = image
    copy_of = {}
    for number, original in enumerate([f"{source}/lot_{lot}/scene_0.jpg" for source in SOURCES for lot in range(3)]):
        source = original.split("/")[0]
        for k, (kind, data) in enumerate(planted_copies(originals[original]).items()):
            target = SOURCES[(SOURCES.index(source) + k + number) % 2]
            key = f"{target}/lot_{(3 + number + 2 * k) % LOTS}/copy_{number}_{kind}.jpg"
            files[key] = data
            copy_of[key] = original
    for key, data in files.items():
        (raw / key).parent.mkdir(parents=True, exist_ok=True)
        (raw / key).write_bytes(data)
    for source in SOURCES:  # every image listed, none with boxes: negatives, all training images
        names = sorted(key.split("/", 1)[1] for key in files if key.startswith(f"{source}/"))
        coco = {
            "categories": [{"id": 1, "name": "part"}],
            "images": [{"id": n, "file_name": name} for n, name in enumerate(names, start=1)],
            "annotations": [],
        }
        (raw / source / ANNOTATIONS_FILE).write_text(json.dumps(coco))
    return copy_of


def validated_rows(raw: Path, base: Path) -> pa.Table:
    """The validation job over `raw` (both sources), its accepted rows as the training set reads them."""
    index = build_raw_index(str(raw))
    (base / "index").mkdir(parents=True)
    write_table(index.frame, RAW_INDEX, base / "index" / "index.parquet")
    (base / "index" / "manifest.json").write_text(json.dumps(whole_root_manifest(str(raw), list(SOURCES))))
    arguments = ["--index", str(base / "index"), "--raw", str(raw), "--out", str(base / "out"), "--workers", "1"]
    validate(get_args_parser().parse_args([*arguments, "--val-fraction", "0.5"]))
    accepted = pd.read_parquet(base / "out" / "accepted.parquet").assign(etag="e")
    return pa.Table.from_pandas(accepted, preserve_index=False).select([*ts.SELECTION_SCHEMA.names, ANNOTATION, PHASH])


def test_planted_copies_train_on_their_originals_side_of_the_split(tmp_path):
    copy_of = make_root(tmp_path / "raw")
    rows = validated_rows(tmp_path / "raw", tmp_path)
    validated = dict(zip(rows.column("key").to_pylist(), rows.column("split").to_pylist()))
    assert set(copy_of) <= set(validated), "every planted copy is accepted"
    # The leak this prevents: validation's split by group puts copies on the other side.
    crossing = [copy for copy, original in copy_of.items() if validated[copy] != validated[original]]
    assert len(crossing) >= 4, crossing

    chosen = select_rows(rows, SelectionPolicy())
    split = dict(zip(chosen.selected.column("key").to_pylist(), chosen.selected.column("split").to_pylist()))
    assert {copy: split[copy] for copy in copy_of} == {copy: split[original] for copy, original in copy_of.items()}
    # Validation groups stay whole too: every (source, group) trains on one side.
    sides = pd.DataFrame(chosen.selected.select(["source", "group", "split"]).to_pylist())
    assert sides.groupby(["source", "group"])["split"].nunique().max() == 1
    members = chosen.near_duplicates.to_pylist()
    grouped = {row["key"]: row["near_duplicate_of"] for row in members}
    for copy, original in copy_of.items():
        assert grouped[copy] == grouped[original]
    assert {row["key"] for row in members} == set(copy_of) | set(copy_of.values())  # no unrelated scene
    counts = near_duplicate_counts(chosen.near_duplicates)
    assert counts["near_duplicate_groups"] == len(set(copy_of.values()))
    assert counts["groups_were_split"] >= 1 and counts["moved_split"] >= 1

    # What the UI shows: the counts, the table, and a contact sheet of the first groups drawn in place.
    shown = near_duplicate_metadata(chosen.near_duplicates, chosen.selected, str(tmp_path / "raw"))
    assert {name: shown[name] for name in counts} == counts
    assert [row.data["key"] for row in shown["near_duplicates"].records] == [row["key"] for row in members]
    sheet = [shown[f"near_duplicate_group_{n}"].value for n in range(1, SHEET_GROUPS + 1)]
    assert all(text.startswith("![") and "data:image/" in text and len(text) < 1000 for text in sheet)
    assert f"near_duplicate_group_{SHEET_GROUPS + 1}" not in shown


def hashed_rows(rows: list[tuple[str, str, str, int]]) -> pa.Table:
    """(source, key, group + split, phash bits) as accepted rows with labels to train on."""
    schema = ts.SELECTION_SCHEMA.append(pa.field(ANNOTATION, pa.string())).append(pa.field(PHASH, pa.int64()))
    table = [
        {
            "source": source,
            "key": key,
            "sha256": f"{n:064x}",
            "size": 1,
            "etag": "e",
            "format": "JPEG",
            "mode": "RGB",
            "width": 8,
            "height": 8,
            "orientation": 1,
            "group": group,
            "split": split,
            "boxes": [],
            "category_names": [],
            ANNOTATION: "annotated",
            PHASH: int(np.array([bits], np.uint64).view(np.int64)[0]),
        }
        for n, (source, key, (group, split), bits) in enumerate(rows)
    ]
    return pa.Table.from_pylist(table, schema=schema)


def test_linked_groups_take_the_split_of_the_group_that_sorts_first():
    far = [0x0F0F0F0F0F0F0F0F, 0xFFFF0000FFFF0000, 0x3C3C3C3C3C3C3C3C]
    rows = hashed_rows(
        [
            ("a", "a/g1/x.jpg", ("g1", "val"), far[0]),
            ("a", "a/g1/y.jpg", ("g1", "val"), far[1]),  # its group goes with x's, unlinked itself
            ("b", "b/g2/x_copy.jpg", ("g2", "train"), far[0] ^ 0b101),  # 2 bits from a/g1/x.jpg
            ("b", "b/g2/z.jpg", ("g2", "train"), far[2]),
            ("b", "b/g3/w.jpg", ("g3", "train"), 0),
        ]
    )
    chosen = select_rows(rows, SelectionPolicy())
    split = dict(zip(chosen.selected.column("key").to_pylist(), chosen.selected.column("split").to_pylist()))
    # (a, g1) sorts before (b, g2): both groups validate; g3 is linked to nothing and keeps its split.
    assert split == {"a/g1/x.jpg": "val", "a/g1/y.jpg": "val", "b/g2/x_copy.jpg": "val", "b/g2/z.jpg": "val",
                     "b/g3/w.jpg": "train"}  # fmt: skip
    assert chosen.near_duplicates.column("key").to_pylist() == ["a/g1/x.jpg", "b/g2/x_copy.jpg"]
    # A distance under the pair's: no near-duplicates, splits as validated.
    apart = select_rows(rows, SelectionPolicy(near_duplicate_max_distance=1))
    assert apart.selected.column("split").to_pylist() == ["val", "val", "train", "train", "train"]
    assert apart.near_duplicates.num_rows == 0
    assert SelectionPolicy().as_config()["near_duplicates"]["max_distance"] == 8

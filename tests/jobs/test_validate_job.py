"""The validation job: box transposes against real EXIF-rotated files, label and split rules, and the
script end to end (in-process with an injected hanging/crashing decoder, and as a real subprocess)."""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image, ImageDraw, ImageOps
from test_image_checks import check_that_hangs_or_crashes  # its light module keeps worker start-up fast
from test_report_pictures import decode_inline

from training_code.lib import validation_pass
from training_code.lib.coco import ANNOTATIONS_FILE, AnnotationError, parse_annotations
from training_code.lib.image_checks import check_image_file
from training_code.lib.labels import HugeInteger, box_to_upright, check_labels, upright_size, vocabulary
from training_code.lib.raw_index import whole_root_manifest
from training_code.lib.reason_meanings import IMAGE_REASONS, LABEL_REASONS
from training_code.lib.storage import list_objects
from training_code.lib.tables import RAW_INDEX, write_table
from training_code.lib.validation_outputs import assign_splits, find_exact_duplicates, split_of_group
from training_code.lib.validation_pass import MANIFEST, validate
from training_code.validate import get_args_parser
from zero_assets.ops.demo_data import _box_in_stored_frame, make_demo_raw_root

REPO = Path(__file__).resolve().parents[2]
TABLES = ("accepted", "quarantine", "duplicates", "rejected_labels", "unmatched")


def red_patch_bbox(image: Image.Image) -> tuple[int, int, int, int]:
    pixels = np.asarray(image.convert("RGB")).astype(int)
    ys, xs = np.nonzero((pixels[..., 0] > 200) & (pixels[..., 1] < 60))
    return int(xs.min()), int(ys.min()), int(xs.max()) + 1, int(ys.max()) + 1


@pytest.mark.parametrize("orientation", range(1, 9))
def test_box_lands_on_the_patch_after_exif_transpose(tmp_path, orientation):
    stored = Image.new("RGB", (60, 40), "black")
    ImageDraw.Draw(stored).rectangle((7, 5, 18, 12), fill="red")  # pixels 7..18 x 5..12: box 7,5,19,13
    exif = Image.Exif()
    exif[0x0112] = orientation
    path = tmp_path / f"orientation_{orientation}.png"
    stored.save(path, exif=exif.tobytes())
    with Image.open(path) as image:
        upright = ImageOps.exif_transpose(image)
    assert upright.size == upright_size(60, 40, orientation)
    assert tuple(box_to_upright((7, 5, 19, 13), orientation, 60, 40)) == red_patch_bbox(upright)
    # The same through the job's own path: verdict from the file, then the COCO box [x, y, w, h].
    verdict = check_image_file(path, ("PNG",), 8)
    assert verdict.orientation == orientation
    annotation = {"id": 1, "category_id": 1, "bbox": [7, 5, 12, 8]}  # COCO x, y, w, h of the stored patch
    labels = check_labels("cam/o.png", [annotation], {1: "nut"}, orientation, verdict.width, verdict.height)
    assert labels.boxes == [list(red_patch_bbox(upright))] and labels.category_names == ["nut"]


@pytest.mark.parametrize("orientation", [3, 6, 8])
def test_mapping_inverts_the_demo_generator(orientation):
    upright_box, upright_wh = (30.5, 10.0, 80.0, 45.25), (120, 90)
    stored_box = _box_in_stored_frame(upright_box, orientation, upright_wh)
    stored_wh = upright_size(*upright_wh, orientation)
    assert box_to_upright(stored_box, orientation, *stored_wh) == pytest.approx(list(upright_box))


CATEGORIES = {1: "hex_nut", 2: "washer"}
LABEL_CASES = {
    "nan": ({"bbox": [float("nan"), 1, 5, 5]}, "non_finite"),
    "infinite": ({"bbox": [1, 1, float("inf"), 5]}, "non_finite"),
    "zero_width": ({"bbox": [1, 1, 0, 5]}, "degenerate"),
    "inverted": ({"bbox": [10, 1, -4, 5]}, "degenerate"),
    "off_right_edge": ({"bbox": [90, 1, 20, 5]}, "outside_image"),
    "negative_corner": ({"bbox": [-3, 1, 20, 5]}, "outside_image"),
    "unknown_category": ({"category_id": 9, "bbox": [1, 1, 5, 5]}, "unknown_category"),
    "three_numbers": ({"bbox": [1, 1, 5]}, "malformed"),
    "text_bbox": ({"bbox": "1,1,5,5"}, "malformed"),
    "no_bbox": ({"bbox": None}, "malformed"),
    "no_category": ({"category_id": None, "bbox": [1, 1, 5, 5]}, "malformed"),
    "integer_past_float": ({"bbox": [int("9" * 400), 1, 5, 5]}, "bad_number"),  # valid JSON; float() overflows
    "integer_past_json_limit": ({"bbox": [HugeInteger(6000), 1, 5, 5]}, "bad_number"),  # as coco parses 6,000 digits
}


@pytest.mark.parametrize("case", sorted(LABEL_CASES))
def test_bad_label_is_rejected_with_its_reason(case):
    fields, reason = LABEL_CASES[case]
    annotation = {"id": 7, "category_id": 1, **fields}
    labels = check_labels("cam/a.jpg", [annotation], CATEGORIES, 1, 100, 50)
    assert labels.boxes == [] and labels.category_names == []
    [row] = labels.rejected
    assert (row["key"], row["annotation_id"], row["reason"]) == ("cam/a.jpg", 7, reason)
    assert row["detail"]


@pytest.mark.parametrize("encoding", ["utf-8", "utf-16"])
def test_an_integer_of_thousands_of_digits_is_a_bad_number_not_an_unreadable_file(encoding):
    # Python's int() refuses 6,000 digits; the file is still valid JSON, so only that box is rejected.
    # (A UTF-8 file without such a run of digits is parsed by json's C scanner alone: both paths.)
    box = '{"id": 1, "image_id": 1, "category_id": 1, "bbox": [%s, 1, 5, 5]}'
    for digits, kept in [(6000, False), (101, False), (100, True)]:
        text = '{"categories": [{"id": 1, "name": "part"}], "images": [{"id": 1, "file_name": "a.jpg"}], '
        text += f'"annotations": [{box % ("9" * digits)}]}}'
        parsed = parse_annotations("cam", text.encode(encoding), "cam/annotations.json")
        value = parsed.annotations_for("a.jpg")[0]["bbox"][0]
        assert (value == int("9" * digits)) if kept else (isinstance(value, HugeInteger) and value.digits == digits)
        checked = check_labels("cam/a.jpg", parsed.annotations_for("a.jpg"), parsed.categories, 1, 64, 64)
        assert [row["reason"] for row in checked.rejected] == ["bad_number" if not kept else "outside_image"]


def test_malformed_coco_entries_are_rejected_one_by_one_naming_the_field():
    document = {
        "categories": [{"id": 1, "name": "part"}, {"name": "no id"}, "not an object"],
        "images": [
            {"id": 1, "file_name": "a.jpg"},
            5,
            {"id": "2", "file_name": "b.jpg"},
            {"id": 3, "file_name": "../c.jpg"},
            {"id": 1, "file_name": "d.jpg"},
        ],
        "annotations": [
            {"id": 1, "image_id": 1, "category_id": 1, "bbox": [1, 1, 4, 4]},
            [],
            {"id": 2, "image_id": 3},
            {"id": int("9" * 400), "image_id": 99},
            {"id": 4, "image_id": None},
        ],
    }
    raw = json.dumps(document).replace('"99"', "99").encode()
    parsed = parse_annotations("cam", raw, "cam/annotations.json")
    assert parsed.categories == {1: "part"} and list(parsed.by_file) == ["a.jpg"] and len(parsed.by_file["a.jpg"]) == 1
    rows = [(row["key"], row["reason"], row["detail"].split(":")[0], row["annotation_id"]) for row in parsed.rejected]
    assert rows == [
        ("cam/annotations.json", "bad_id", "categories[1]", -1),
        ("cam/annotations.json", "not_an_object", "categories[2]", -1),
        ("cam/annotations.json", "not_an_object", "images[1]", -1),
        ("cam/annotations.json", "bad_id", "images[2]", -1),
        ("cam/annotations.json", "bad_file_name", "images[3]", -1),
        ("cam/annotations.json", "bad_id", "images[4]", -1),
        ("cam/annotations.json", "not_an_object", "annotations[1]", -1),
        ("cam/annotations.json", "unknown_image", "annotations[2]", 2),
        ("cam/annotations.json", "unknown_image", "annotations[3]", -1),  # an id past int64 is no id
        ("cam/annotations.json", "bad_id", "annotations[4]", 4),
    ]


@pytest.mark.parametrize(
    "raw, message",
    [
        (b"[1, 2]", "the top level is a JSON list"),
        (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
        (b'{"images": [], "annotations": {}}', "field 'annotations' is not a list"),
        (b"\xff\xfe\xfa", "not valid JSON"),
        (
            b'{"images": [], "annotations": [], "categories": [], "x": "' + b"y" * 2000 + b'"}',
            "above the annotation file limit of 1000",
        ),
    ],
)
def test_an_unusable_coco_file_is_one_error_naming_the_file(raw, message):
    with pytest.raises(AnnotationError, match=rf"^cam/annotations.json: .*{re.escape(message)}"):
        parse_annotations("cam", raw, "cam/annotations.json", max_bytes=1000 if b"yyy" in raw else 10**6)


def test_sub_pixel_overshoot_is_clipped_and_good_boxes_kept():
    annotations = [
        {"id": 1, "category_id": 2, "bbox": [-0.4, 2, 10, 10]},
        {"id": 2, "category_id": 1, "bbox": [95, 40, 5.6, 10.5]},  # x2 = 100.6, y2 = 50.5: within 1 px
    ]
    labels = check_labels("cam/a.jpg", annotations, CATEGORIES, 1, 100, 50)
    assert labels.rejected == []
    assert labels.boxes == [[0.0, 2.0, 9.6, 12.0], [95.0, 40.0, 100.0, 50.0]]
    assert labels.category_names == ["washer", "hex_nut"]


def test_vocabulary_is_sorted_names_with_ids_from_one():
    assert vocabulary([{1: "washer", 2: "bolt"}, {5: "gear", 1: "washer"}]) == [
        {"id": 1, "name": "bolt"},
        {"id": 2, "name": "gear"},
        {"id": 3, "name": "washer"},
    ]


def test_split_is_the_documented_hash_and_stable_as_groups_grow():
    group, seed = "line_a_camera/lot_003", 4
    point = int(hashlib.sha256(f"{seed}:{group}".encode()).hexdigest()[:8], 16) / 2**32
    assert split_of_group(group, seed, 0.2) == ("val" if point < 0.2 else "train")
    few = [f"src/lot_{n:03d}" for n in range(50)]
    more = pa.array(few + [f"src/lot_{n:03d}" for n in range(50, 400)] + few)  # groups repeat across rows
    assert assign_splits(pa.array(few), seed, 0.2).to_pylist() == assign_splits(more, seed, 0.2).to_pylist()[:50]
    assert assign_splits(more, seed, 0.2).to_pylist()[-50:] == assign_splits(more, seed, 0.2).to_pylist()[:50]
    assert 0.1 < assign_splits(more, seed, 0.2).to_pylist().count("val") / len(more) < 0.3


def test_exact_duplicates_keep_the_first_key_in_sorted_order():
    rows = pa.table(
        {"key": ["b/2.jpg", "a/1.jpg", "c/3.jpg", "a/0.jpg"], "sha256": ["x" * 64, "x" * 64, "y" * 64, "x" * 64]}
    )
    duplicates = find_exact_duplicates(rows)
    assert duplicates.to_pylist() == [
        {"key": "a/1.jpg", "sha256": "x" * 64, "duplicate_of": "a/0.jpg"},
        {"key": "b/2.jpg", "sha256": "x" * 64, "duplicate_of": "a/0.jpg"},
    ]


def build_index(raw: Path, index_dir: Path) -> pd.DataFrame:
    """The raw_image_index contract from a listing: group = source/lot, annotation_count from COCO, and
    the manifest's record of the raw root and each source's annotations.json (what the job checks)."""
    parsed, rows = {}, []
    for obj in list_objects(raw):
        source, _, file_name = obj.key.partition("/")
        if file_name == ANNOTATIONS_FILE:
            continue
        if source not in parsed and (raw / source / ANNOTATIONS_FILE).is_file():
            parsed[source] = parse_annotations(source, (raw / source / ANNOTATIONS_FILE).read_bytes(), source)
        count = len(parsed[source].annotations_for(file_name)) if source in parsed else 0
        group = "/".join(obj.key.split("/")[:2])
        rows.append(
            {
                "source": source,
                "key": obj.key,
                "size": obj.size,
                "etag": obj.etag,
                "group": group,
                "annotation_count": count,
            }
        )
    index_dir.mkdir(parents=True, exist_ok=True)
    manifest = whole_root_manifest(str(raw), sorted({row["source"] for row in rows}))
    (index_dir / "manifest.json").write_text(json.dumps(manifest))
    return write_table(pd.DataFrame(rows), RAW_INDEX, index_dir / "index.parquet")


def jpeg_bytes(seed: int) -> bytes:
    image = Image.fromarray(np.random.default_rng(seed).integers(0, 255, (48, 64, 3), dtype=np.uint8))
    buffer = io.BytesIO()
    image.save(buffer, "JPEG")
    return buffer.getvalue()


def make_small_raw(raw: Path, names: list[str]) -> None:
    """One source `cam` with good JPEGs under the given names (bad ones are overwritten by the caller)."""
    coco = {"images": [], "annotations": [], "categories": [{"id": 1, "name": "part"}]}
    for n, name in enumerate(names, start=1):
        (raw / "cam" / name).parent.mkdir(parents=True, exist_ok=True)
        (raw / "cam" / name).write_bytes(jpeg_bytes(n))
        coco["images"].append({"id": n, "file_name": name, "width": 64, "height": 48})
        coco["annotations"].append({"id": n, "image_id": n, "category_id": 1, "bbox": [4, 4, 20, 20]})
    (raw / "cam" / ANNOTATIONS_FILE).write_text(json.dumps(coco))


def test_hang_and_crash_cost_one_file_each(tmp_path):
    names = [f"lot_{n % 3}/img_{n}.jpg" for n in range(8)] + ["lot_0/hang.jpg", "lot_1/segfault.jpg"]
    make_small_raw(tmp_path / "raw", names)
    build_index(tmp_path / "raw", tmp_path / "index")
    args = get_args_parser().parse_args(
        [
            "--index",
            str(tmp_path / "index"),
            "--raw",
            str(tmp_path / "raw"),
            "--out",
            str(tmp_path / "out"),
            "--workers",
            "2",
            "--timeout-s",
            "1",
        ]
    )
    manifest, manifest_bytes, _, _ = validate(args, check=check_that_hangs_or_crashes)
    quarantine = pd.read_parquet(tmp_path / "out" / "quarantine.parquet").set_index("key")
    for key, reason in [("cam/lot_0/hang.jpg", "timeout"), ("cam/lot_1/segfault.jpg", "crash")]:
        assert quarantine.loc[key, "reason"] == reason
        assert quarantine.loc[key, "sha256"] == hashlib.sha256((tmp_path / "raw" / key).read_bytes()).hexdigest()
    assert manifest["counts"]["accepted"] == 8 and manifest["counts"]["quarantined"] == 2
    assert (tmp_path / "out" / MANIFEST).read_bytes() == manifest_bytes


def test_too_many_quarantined_fails_with_tables_but_no_manifest(tmp_path):
    names = [f"lot_0/img_{n}.jpg" for n in range(4)]
    make_small_raw(tmp_path / "raw", names)
    (tmp_path / "raw" / "cam" / names[0]).write_bytes(b"")
    (tmp_path / "raw" / "cam" / names[1]).write_bytes(b"not an image")
    build_index(tmp_path / "raw", tmp_path / "index")
    out = tmp_path / "out"
    out.mkdir()
    (out / MANIFEST).write_text("{}")  # from an earlier run: must not survive to vouch for new tables
    args = get_args_parser().parse_args(
        [
            "--index",
            str(tmp_path / "index"),
            "--raw",
            str(tmp_path / "raw"),
            "--out",
            str(out),
            "--max-quarantine-rate",
            "0.25",
            "--workers",
            "1",
        ]
    )
    expected = (
        r"2 of 4 images quarantined \(50.0%\), above --max-quarantine-rate 25.0%; top reasons: empty 1, unidentified 1"
    )
    with pytest.raises(SystemExit, match=expected):
        validate(args)
    assert not (out / MANIFEST).exists()
    assert len(pd.read_parquet(out / "quarantine.parquet")) == 2 and len(pd.read_parquet(out / "accepted.parquet")) == 2


def test_same_data_in_another_folder_gives_the_same_manifest_bytes(tmp_path):
    """The manifest hash is the data version: paths, worker count and object addresses must not leak in."""
    make_small_raw(tmp_path / "raw", ["lot_0/a.jpg", "lot_1/b.jpg", "lot_1/c.jpg"])
    (tmp_path / "raw" / "cam" / "lot_1" / "c.jpg").write_bytes(b"<html>not an image</html>")
    build_index(tmp_path / "raw", tmp_path / "index")
    manifests = []
    for out, workers in [("first", "1"), ("second", "2")]:
        args = get_args_parser().parse_args(
            [
                "--index",
                str(tmp_path / "index"),
                "--raw",
                str(tmp_path / "raw"),
                "--out",
                str(tmp_path / out),
                "--workers",
                workers,
            ]
        )
        manifests.append(validate(args)[1])
    assert manifests[0] == manifests[1]


def test_impossible_settings_fail_before_any_work(tmp_path):
    args = get_args_parser().parse_args(
        [
            "--index",
            str(tmp_path / "nowhere"),
            "--raw",
            str(tmp_path),
            "--out",
            str(tmp_path / "out"),
            "--val-fraction",
            "1.5",
            "--workers",
            "0",
        ]
    )
    with pytest.raises(ValueError, match=r"--val-fraction 1.5 must be within \[0, 1\]; --workers 0 must be at least 1"):
        validate(args)


def test_job_script_does_not_import_dagster():
    code = "import sys, training_code.validate; print(sorted(m for m in sys.modules if m.split('.')[0] == 'dagster'))"
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


def test_validate_script_end_to_end_on_the_demo_raw_root(tmp_path):
    summary = make_demo_raw_root(tmp_path / "raw", images=30, seed=1)
    index = build_index(tmp_path / "raw", tmp_path / "index")
    out = tmp_path / "out"
    command = [
        sys.executable,
        "-m",
        "training_code.validate",
        "--index",
        str(tmp_path / "index"),
        "--raw",
        str(tmp_path / "raw"),
        "--out",
        str(out),
        "--workers",
        "2",
    ]
    # Not launched by Dagster (the reporter prints the event); a failure file would go under tmp_path.
    env = {k: v for k, v in os.environ.items() if not k.startswith("DAGSTER_PIPES")} | {
        "ZERO_OPT_ML": str(tmp_path / "opt_ml")
    }
    result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    tables = {name: pd.read_parquet(out / f"{name}.parquet") for name in TABLES}
    manifest_bytes = (out / MANIFEST).read_bytes()
    manifest, counts = json.loads(manifest_bytes), json.loads(manifest_bytes)["counts"]

    planted = summary["planted"]
    quarantine = tables["quarantine"].set_index("key")
    expected = {
        "truncated_jpeg": "truncated",
        "zero_byte": "empty",
        "text_as_jpg": "unidentified",
        "png_bad_crc": "checksum",
    }
    for case, reason in expected.items():
        assert quarantine.loc[planted[case], "reason"] == reason, case
    duplicates = tables["duplicates"].set_index("key")
    assert duplicates.loc[planted["duplicate_across_sources"], "duplicate_of"].startswith("line_a_camera/")
    rejected = tables["rejected_labels"]
    assert rejected.loc[rejected["key"] == planted["box_outside_image"], "reason"].tolist() == ["outside_image"]
    unmatched = set(zip(tables["unmatched"]["kind"], tables["unmatched"]["key"]))
    assert ("image_without_annotation", planted["image_without_annotation"]) in unmatched
    assert ("annotation_without_image", planted["annotation_without_image"]) in unmatched

    accepted = tables["accepted"]
    assert planted["image_without_annotation"] in set(accepted["key"])  # a valid image, reported, kept with no labels
    assert counts["images_in"] == len(index) == counts["accepted"] + counts["quarantined"] + counts["duplicates"]
    assert (counts["accepted"], counts["quarantined"], counts["duplicates"]) == (
        len(accepted),
        len(quarantine),
        len(duplicates),
    )
    assert counts["train"] + counts["val"] == counts["accepted"]
    assert counts["labels_in"] == counts["labels_accepted"] + counts["labels_rejected"]
    assert counts["labels_accepted"] == int(accepted["boxes"].map(len).sum()) and counts["labels_rejected"] == len(
        rejected
    )
    assert not set(accepted.loc[accepted["split"] == "train", "group"]) & set(
        accepted.loc[accepted["split"] == "val", "group"]
    )
    assert set(accepted["orientation"]) > {1}  # the demo stores some EXIF-rotated JPEGs

    assert manifest["format"] == "zero-validated/1" and manifest["validator_version"]
    assert json.loads((out / "categories.json").read_text()) == [
        {"id": 1, "name": "bolt"},
        {"id": 2, "name": "gear"},
        {"id": 3, "name": "hex_nut"},
        {"id": 4, "name": "washer"},
    ]
    for name, digest in manifest["files"].items():
        assert hashlib.sha256((out / name).read_bytes()).hexdigest() == digest, name

    [event] = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    assert event["data_version"] == hashlib.sha256(manifest_bytes).hexdigest()
    metadata = event["metadata"]
    assert {k: metadata[k] for k in ("images_in", "accepted", "quarantined", "duplicates")} == {
        k: counts[k] for k in ("images_in", "accepted", "quarantined", "duplicates")
    }
    assert {"reason": "truncated", "count": 1, "meaning": IMAGE_REASONS["truncated"]} in metadata[
        "quarantined_by_reason"
    ]["records"]
    assert {"reason": "outside_image", "count": 1, "meaning": LABEL_REASONS["outside_image"]} in metadata[
        "labels_rejected_by_reason"
    ]["records"]
    assert [column["type"] for column in metadata["quarantined_by_reason"]["schema"]] == ["string", "int", "string"]
    assert metadata["dagster/row_count"] == counts["accepted"]
    # The contact sheet: of the quarantined files only the PNG with a bad CRC still decodes.
    assert metadata["quarantined_images_shown"] == 1 and "quarantined_image_2" not in metadata
    markdown = metadata["quarantined_image_1"]
    assert decode_inline(markdown).size == (
        160,
        120,
    )  # the planted 320 x 240 scene, within the sheet's 160-pixel square
    assert len(markdown) < 1000 and markdown.endswith(
        "\n\nchecksum: " + planted["png_bad_crc"].replace("_", "\\_").replace(".", "\\.")
    )
    assert (
        manifest["files"]["quarantine_contact_sheet.png"]
        == hashlib.sha256((out / "quarantine_contact_sheet.png").read_bytes()).hexdigest()
    )


def test_previous_verdicts_are_reused_only_for_unchanged_files_and_settings(tmp_path):
    names = [f"lot_{n % 2}/img_{n}.jpg" for n in range(6)]
    make_small_raw(tmp_path / "raw", names)
    build_index(tmp_path / "raw", tmp_path / "index")

    def run(out: str, previous: str | None, *extra: str):
        arguments = [
            "--index",
            str(tmp_path / "index"),
            "--raw",
            str(tmp_path / "raw"),
            "--out",
            str(tmp_path / out),
            "--workers",
            "1",
            *extra,
        ]
        return validate(
            get_args_parser().parse_args(arguments + (["--previous", str(tmp_path / previous)] if previous else []))
        )[:3]

    full_manifest, full_bytes, work = run("full", None)
    assert work == {"decoded": 6, "reused": 0}
    same_manifest, same_bytes, work = run("same", "full")
    assert work == {"decoded": 0, "reused": 6} and same_bytes == full_bytes, "reuse must not change the result"

    changed = tmp_path / "raw" / "cam" / names[0]
    changed.write_bytes(b"")  # new size and mtime: a new etag, so it is decoded again
    (tmp_path / "raw" / "cam" / "lot_1" / "new.jpg").write_bytes(jpeg_bytes(99))
    build_index(tmp_path / "raw", tmp_path / "index")
    manifest, _, work = run("changed", "same")
    assert work == {"decoded": 2, "reused": 5}
    assert manifest["counts"]["quarantined_by_reason"] == {"empty": 1} and manifest["counts"]["images_in"] == 7

    _, _, work = run("stricter", "changed", "--min-side", "16")
    assert work == {"decoded": 7, "reused": 0}, "another decode setting invalidates every cached verdict"


def test_a_refresh_makes_rows_only_of_what_it_decodes_and_writes_what_a_full_run_writes(tmp_path, monkeypatch):
    names = [f"lot_{n % 4}/img_{n}.jpg" for n in range(40)]
    make_small_raw(tmp_path / "raw", names)
    build_index(tmp_path / "raw", tmp_path / "index")
    rows_made: list[list[str]] = []  # the keys of every verdict that became a Python row, a call each
    made = validation_pass.verdict_table

    def counted(listed, verdicts):
        rows_made.append(listed.column("key").to_pylist())
        return made(listed, verdicts)

    monkeypatch.setattr(validation_pass, "verdict_table", counted)

    def run(out: str, previous: str | None) -> bytes:
        arguments = ["--index", str(tmp_path / "index"), "--raw", str(tmp_path / "raw"), "--out", str(tmp_path / out)]
        arguments += ["--workers", "1"] + (["--previous", str(tmp_path / previous)] if previous else [])
        return validate(get_args_parser().parse_args(arguments))[1]

    run("first", None)
    assert sorted(key for keys in rows_made for key in keys) == sorted(f"cam/{name}" for name in names)
    (tmp_path / "raw" / "cam" / names[3]).write_bytes(jpeg_bytes(77))  # changed: a new etag
    (tmp_path / "raw" / "cam" / "lot_2" / "new.jpg").write_bytes(jpeg_bytes(78))
    build_index(tmp_path / "raw", tmp_path / "index")
    rows_made.clear()
    refreshed = run("refresh", "first")
    assert rows_made == [["cam/lot_2/new.jpg", f"cam/{names[3]}"]], "the 39 reused verdicts stay columns"
    assert refreshed == run("full", None), "a refresh writes the manifest a full run does"
    for table in [*TABLES, "verdicts"]:
        assert pq.read_table(tmp_path / "refresh" / f"{table}.parquet").equals(
            pq.read_table(tmp_path / "full" / f"{table}.parquet")
        ), table

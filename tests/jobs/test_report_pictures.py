"""Pictures the Dagster UI draws in place, and the typed tables beside them.

Every picture entry is Markdown shorter than the UI's inline limit (1000 characters) whose data URI
decodes to an image of the expected size; the contact sheet of the quarantine shows only quarantined
files that still decode, under the validator's guards (a too_large file is never opened: a sparse
1 GB file leaves the peak memory low); the evaluation reaches Dagster through Pipes with per-class AP
as a table of floats and the images evaluated as its row count.
"""

from __future__ import annotations

import base64
import io
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import make_resources
from dagster import (
    MarkdownMetadataValue,
    PathMetadataValue,
    PipesSubprocessClient,
    TableMetadataValue,
    asset,
    materialize,
)
from helpers.graph_runs import materialize_source
from helpers.process_tree import PEAK_RSS
from PIL import Image
from test_evaluate_job import CATEGORIES, write_val_shards

from training_code import evaluate
from training_code.lib.contact_sheet import MAX_THUMBNAILS, THUMBNAIL_SIDE, quarantine_thumbnails
from training_code.lib.hashing import sha256_bytes
from training_code.lib.inline_pictures import INLINE_LIMIT, WIDTHS, inline_picture
from training_code.lib.model import build_model, model_config, save_model_file
from training_code.lib.reason_meanings import IMAGE_REASONS, LABEL_REASONS
from training_code.lib.report_plots import SamplePicture
from training_code.lib.tables import LABEL_REASONS as LABEL_CODES
from training_code.lib.tables import REASONS
from zero_assets.defs.assets.raw_image_index import raw_image_index
from zero_assets.defs.assets.validated_images import validated_images
from zero_assets.ops.demo_data import _png_with_bad_crc

REPO = Path(__file__).resolve().parents[2]
DATA_URI = re.compile(r"^!\[[^\n]*\]\(data:image/(webp|png|jpeg);base64,([A-Za-z0-9+/=]+)\)")


def decode_inline(markdown: str) -> Image.Image:
    """The picture of an inline Markdown entry, after checking the entry is drawn in place."""
    assert len(markdown) < INLINE_LIMIT, f"{len(markdown)} characters: the UI would hide it behind [Show Markdown]"
    match = DATA_URI.match(markdown)
    assert match, markdown[:120]
    image = Image.open(io.BytesIO(base64.b64decode(match.group(2))))
    image.load()
    return image


def encoded(image: Image.Image, fmt: str = "PNG") -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, fmt)
    return buffer.getvalue()


def scene(seed: int, size=(320, 240)) -> Image.Image:
    rng = np.random.default_rng(seed)
    image = np.full((size[1], size[0], 3), rng.integers(40, 200, 3), dtype=np.uint8)
    image[size[1] // 4 : size[1] // 2, size[0] // 4 : size[0] // 2] = (220, 30, 30)
    return Image.fromarray(image)


@pytest.mark.parametrize("kind", ["noise", "scene", "tall"])
def test_a_picture_fits_the_inline_limit_whatever_it_holds(kind):
    rng = np.random.default_rng(0)
    picture = {
        "noise": Image.fromarray(rng.integers(0, 255, (480, 640, 3), dtype=np.uint8)),  # the worst case for any codec
        "scene": scene(1),
        "tall": scene(2, (60, 900)),
    }[kind]
    hostile = "cam/a](javascript:alert(1))<script>\n" + "x" * 300
    markdown = inline_picture(picture, hostile, hostile)
    image = decode_inline(markdown)
    assert max(image.size) in WIDTHS and abs(image.width / image.height - picture.width / picture.height) < 0.1
    assert "](javascript" not in markdown and "<script>" not in markdown and markdown.count("\n") == 2, (
        "the key stays text"
    )


def test_the_evaluation_thumbnails_fit_and_keep_their_size():
    curve = {
        "iou": 0.5,
        "recall": [i / 100 for i in range(101)],
        "mean": [1 - i / 100 for i in range(101)],
        "per_class": {f"class_{n}": [max(0.0, 1 - i / (40 + n)) for i in range(101)] for n in range(12)}
        | {"none": None},
    }
    samples = [
        SamplePicture(
            f"val/{n}.png",
            torch.from_numpy(np.asarray(scene(n, (120, 90))).transpose(2, 0, 1).copy()),
            [[10.0, 10.0, 40.0, 40.0]],
            [[12.0, 8.0, 44.0, 41.0]],
        )
        for n in range(4)
    ]
    entries = evaluate.inline_pictures(curve, samples)
    assert list(entries) == [
        "pr_curve",
        "sample_prediction_1",
        "sample_prediction_2",
        "sample_prediction_3",
        "sample_prediction_4",
    ]
    plot = decode_inline(entries["pr_curve"]["raw_value"])
    assert plot.width in WIDTHS and plot.height == round(plot.width * 0.7) and plot.width >= 96, plot.size
    for number in range(1, 5):
        markdown = entries[f"sample_prediction_{number}"]["raw_value"]
        assert decode_inline(markdown).size == (120, 90), "a thumbnail is never enlarged"
        assert f"val/{number - 1}\\.png: 1 true \\(green\\), 1 predicted" in markdown


def bad_crc_png(seed: int) -> bytes:
    return _png_with_bad_crc(encoded(scene(seed)))


def quarantine_root(raw: Path) -> pd.DataFrame:
    """A raw root of quarantined files and their quarantine rows (key, sha256, reason)."""
    (raw / "cam").mkdir(parents=True)
    files = {
        "cam/a_crc.png": (bad_crc_png(1), "checksum"),  # decodes: shown
        "cam/a_damaged.jpg": (
            encoded(scene(2), "JPEG"),
            "corrupt_data",
        ),  # Pillow decodes what libjpeg-turbo refused: shown
        "cam/b_small.png": (encoded(Image.new("RGB", (4, 3), "blue")), "too_small"),  # decodes: shown
        "cam/c_truncated.jpg": (encoded(scene(3), "JPEG")[:900], "decode_error"),  # does not decode: left out
        "cam/d_changed.png": (bad_crc_png(4), "checksum"),  # bytes changed since the verdict: left out
        "cam/e_big_valid.png": (encoded(scene(5)), "too_large"),  # decodable, but its reason forbids opening it
        "cam/f_text.png": (b"AWS_SECRET_ACCESS_KEY=do-not-quote\n", "unidentified"),
    }
    rows = []
    for key, (data, reason) in files.items():
        (raw / key).write_bytes(data)
        rows.append({"key": key, "sha256": sha256_bytes(data), "reason": reason})
    (raw / "cam" / "d_changed.png").write_bytes(bad_crc_png(44))
    with open(raw / "cam" / "huge.png", "wb") as handle:  # sparse: 1 GB that takes no disk
        handle.truncate(1 << 30)
    rows.append({"key": "cam/huge.png", "sha256": "0" * 64, "reason": "too_large"})  # were it read, 1 GB in a worker
    rows.append({"key": "cam/escape.png", "sha256": "0" * 64, "reason": "outside_root"})
    return pd.DataFrame(rows)


# Draws the sheet in a child process and prints its thumbnails; PEAK_RSS (tests/helpers/process_tree.py) runs it
# and prints the peak memory of it and every process under it.
SHEET_CHILD = """
import json, sys
import pandas as pd
from training_code.lib.contact_sheet import quarantine_thumbnails
raw, rows = sys.argv[1], pd.read_json(sys.argv[2], dtype=False)
# The byte limit lifted past the sparse file: only the reason may keep it unopened.
thumbnails = quarantine_thumbnails(raw, rows, max_bytes=2 << 30, max_pixels=10**9, timeout_s=20, workers=2)
print(json.dumps([[t.key, t.reason, t.png.hex()] for t in thumbnails]))
"""


def test_the_contact_sheet_draws_only_decodable_quarantined_files_and_never_opens_a_too_large_one(tmp_path):
    rows = quarantine_root(tmp_path / "raw")
    (tmp_path / "rows.json").write_text(rows.to_json())
    command = [
        sys.executable,
        "-c",
        PEAK_RSS,
        sys.executable,
        "-c",
        SHEET_CHILD,
        str(tmp_path / "raw"),
        str(tmp_path / "rows.json"),
    ]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    drawn = [(key, reason, Image.open(io.BytesIO(bytes.fromhex(png)))) for key, reason, png in json.loads(lines[0])]
    assert [(key, reason) for key, reason, _ in drawn] == [
        ("cam/a_crc.png", "checksum"),
        ("cam/a_damaged.jpg", "corrupt_data"),
        ("cam/b_small.png", "too_small"),
    ]
    assert [image.size for _, _, image in drawn] == [(THUMBNAIL_SIDE, THUMBNAIL_SIDE * 3 // 4)] * 2 + [(4, 3)]
    peak_mb = int(lines[1].split()[1]) / 1024
    print(f"peak memory drawing the sheet beside a 1 GB file: {peak_mb:.0f} MB")
    assert peak_mb < 400, f"{peak_mb:.0f} MB: the too_large file was read"


def test_the_sheet_is_bounded_and_first_by_key(tmp_path):
    (tmp_path / "cam").mkdir()
    rows = []
    for n in reversed(range(MAX_THUMBNAILS + 3)):
        data = bad_crc_png(n)
        (tmp_path / "cam" / f"{n:02d}.png").write_bytes(data)
        rows.append({"key": f"cam/{n:02d}.png", "sha256": sha256_bytes(data), "reason": "checksum"})
    thumbnails = quarantine_thumbnails(
        tmp_path, pd.DataFrame(rows), max_bytes=1 << 20, max_pixels=10**6, timeout_s=20, workers=2
    )
    assert [t.key for t in thumbnails] == [f"cam/{n:02d}.png" for n in range(MAX_THUMBNAILS)]


def test_every_reason_code_has_a_meaning():
    assert set(IMAGE_REASONS) == set(REASONS) and set(LABEL_REASONS) == set(LABEL_CODES)


def test_the_evaluation_reaches_dagster_through_pipes_with_typed_tables_and_inline_pictures(tmp_path):
    shards = write_val_shards(tmp_path / "shards")
    config = model_config(
        "fcos_tiny", CATEGORIES, width=16, min_size=64, max_size=96, score_thresh=0.0, detections_per_img=20
    )
    save_model_file(tmp_path / "model", build_model(config), config, step=0, args={})
    out = tmp_path / "out"

    @asset
    def map_report(context, pipes_subprocess_client: PipesSubprocessClient):
        command = [
            sys.executable,
            "-m",
            "training_code.evaluate",
            "--model",
            str(tmp_path / "model"),
            "--shards",
            str(shards),
            "--out",
            str(out),
            "--batch-size",
            "2",
            "--threads",
            "1",
        ]
        return pipes_subprocess_client.run(command=command, context=context, cwd=str(REPO)).get_materialize_result()

    result = materialize([map_report], resources={"pipes_subprocess_client": PipesSubprocessClient()})
    [event] = result.asset_materializations_for_node("map_report")
    metadata = event.metadata
    table = metadata["per_class_ap"]
    assert isinstance(table, TableMetadataValue)
    assert [(c.name, c.type) for c in table.schema.columns] == [
        ("category", "string"),
        ("AP", "float"),
        ("AP@0.5", "float"),
    ]
    assert all(c.description for c in table.schema.columns)
    cells = {record.data["category"]: record.data["AP"] for record in table.records}
    assert cells["never_seen"] is None and isinstance(cells["nut"], float), cells
    assert metadata["dagster/row_count"].value == 5 == metadata["val_images"].value
    for name in ("pr_curve", *(f"sample_prediction_{n}" for n in range(1, 5))):
        assert isinstance(metadata[name], MarkdownMetadataValue), name
        decode_inline(metadata[name].value)
    listed = json.loads((out / "manifest.json").read_text())["files"]
    for name in ("pr_curve.png", "sample_predictions.png"):  # the full-size pictures, vouched for by the manifest
        assert listed[name]["sha256"] == sha256_bytes((out / name).read_bytes())
        assert Image.open(out / name).width >= 480


def test_validated_images_shows_its_contact_sheet_and_typed_tables_in_dagster(tiny_demo, instance, tmp_path):
    """Through the asset and the local runner: the demo's line_a_camera quarantines a PNG with a bad CRC,
    which still decodes."""
    resources = make_resources(Path(tiny_demo["out"]), tmp_path / "state")
    result = materialize_source(
        "line_a_camera", instance=instance, resources=resources, assets=[raw_image_index, validated_images]
    )
    metadata = result.asset_materializations_for_node("validated_images")[0].metadata
    assert metadata["dagster/row_count"].value == metadata["accepted"].value
    for table in ("quarantined_by_reason", "labels_rejected_by_reason"):
        assert isinstance(metadata[table], TableMetadataValue)
        assert [c.name for c in metadata[table].schema.columns] == ["reason", "count", "meaning"]
    # job_env.table types a column by its values: this source rejects no label, so only the quarantine's count is typed.
    assert [c.type for c in metadata["quarantined_by_reason"].schema.columns] == ["string", "int", "string"]
    assert {r.data["reason"]: r.data["meaning"] for r in metadata["quarantined_by_reason"].records}[
        "checksum"
    ] == IMAGE_REASONS["checksum"]
    assert metadata["quarantined_images_shown"].value == 1 and "quarantined_image_2" not in metadata
    entry = metadata["quarantined_image_1"]
    assert isinstance(entry, MarkdownMetadataValue) and entry.value.endswith(
        "checksum: line\\_a\\_camera/lot\\_900/bad\\_crc\\.png"
    )
    assert decode_inline(entry.value).size == (THUMBNAIL_SIDE, THUMBNAIL_SIDE * 3 // 4)  # the planted 320 x 240 scene
    sheet = metadata["quarantine_contact_sheet_png"]
    assert isinstance(sheet, PathMetadataValue)
    out = Path(metadata["dagster/uri"].value)
    assert Path(sheet.value) == out / "quarantine_contact_sheet.png"
    assert json.loads((out / "manifest.json").read_text())["files"]["quarantine_contact_sheet.png"] == sha256_bytes(
        Path(sheet.value).read_bytes()
    )

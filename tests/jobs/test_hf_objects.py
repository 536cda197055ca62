"""Shards carry the Hugging Face detection convention: `image_id` and `objects` (`bbox` COCO x, y, w, h,
`category` a ClassLabel, `area`, `id`) beside the flat columns the trainer reads. A `datasets` installed
on its own (a fresh venv with datasets and pyarrow only) loads a set and sees them, and a set in S3
loads through fsspec (s3fs, the `hf` extra) as the README shows, kept shards included, masked rows not."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import datasets
import pytest
from helpers.selections import write_selection
from test_hf_dataset_shards import CATEGORIES, _rows

from training_code.lib import shard_hf_remote
from training_code.lib.shard_format import read_manifest, shard_path
from training_code.lib.shard_plan import Compaction
from training_code.shard import build_shards

REPO = Path(__file__).resolve().parents[2]
NAMES = [c["name"] for c in CATEGORIES]
# Where the separate install's wheels are kept between runs: downloaded once, then installed offline.
WHEELS = Path.home() / ".cache" / "zero-assets" / "hf-wheels"


@pytest.fixture(scope="module")
def two_sets(tmp_path_factory) -> tuple[Path, list[dict]]:
    """`lake/arrow_shards/second`, which keeps the shards of `first` by reference and masks one row
    of them (it left the selection); returns the lake and the rows `second` selects."""
    tmp = tmp_path_factory.mktemp("hf_objects")
    raw, lake = tmp / "raw", tmp / "lake" / "arrow_shards"
    every = _rows(raw, images=15)
    build_shards(write_selection(tmp / "sel1", every[:12], NAMES), raw, lake / "first", 2000)
    rows = every[1:]  # one row leaves the selection, three arrive
    build_shards(
        write_selection(tmp / "sel2", rows, NAMES),
        raw,
        lake / "second",
        2000,
        previous=lake / "first",
        previous_name="first",
        compaction=Compaction(compact_masked_share=1.0),
    )
    return tmp / "lake", rows


def coco(box: list[float]) -> list[float]:
    x1, y1, x2, y2 = box
    return [x1, y1, x2 - x1, y2 - y1]


def test_objects_hold_the_flat_boxes_as_coco_with_classlabel_categories(two_sets):
    lake, rows = two_sets
    folder = lake / "arrow_shards" / "second"
    manifest = read_manifest(folder)
    assert any(entry["path"].startswith("../first/") for entry in manifest["shards"]), "a kept shard is read too"
    loaded = datasets.load_from_disk(str(folder))
    ids, image_ids = [], []
    for split, data in loaded.items():
        objects = data.features["objects"]
        assert (
            isinstance(objects["category"].feature, datasets.ClassLabel)
            and objects["category"].feature.names[1:] == NAMES
        ), split
        assert objects["bbox"].feature.length == 4, "a box is four numbers"
        for row in data.select_columns(["key", "boxes", "category_ids", "category_names", "image_id", "objects"]):
            found = row["objects"]
            assert found["bbox"] == [coco(box) for box in row["boxes"]] and found["bbox"], row["key"]
            assert found["category"] == row["category_ids"]
            assert objects["category"].feature.int2str(found["category"]) == row["category_names"]
            assert found["area"] == pytest.approx([w * h for _, _, w, h in found["bbox"]])
            ids += found["id"]
            image_ids.append(row["image_id"])
    assert len(set(ids)) == len(ids) and len(set(image_ids)) == len(image_ids), "ids name one object, one image"
    # The transformers recipes' access pattern, a row at a time: objects as a dict of aligned lists.
    one = loaded["train"].select_columns(["objects"])[0]["objects"]
    assert set(one) == {"id", "area", "bbox", "category"} and len({len(v) for v in one.values()}) == 1


def test_ids_are_the_same_for_a_row_in_every_set_that_holds_it(two_sets):
    lake, _ = two_sets
    by_key = {}
    for name in ("first", "second"):
        for entry in read_manifest(lake / "arrow_shards" / name)["shards"]:
            shard = datasets.Dataset.from_file(str(shard_path(lake / "arrow_shards" / name, entry)))
            for row in shard.select_columns(["key", "image_id", "objects"]):
                assert by_key.setdefault(row["key"], (row["image_id"], row["objects"]["id"])) == (
                    row["image_id"],
                    row["objects"]["id"],
                ), row["key"]


def readme_s3_block() -> str:
    """The docs' Python block that loads a shard set from S3 (docs/shards.md, "A shard set in S3")."""
    page = (REPO / "docs" / "shards.md").read_text()
    found = re.search(r"<!-- hf-s3-example -->\n```python\n(.*?)\n```", page, re.S)
    assert found, "docs/shards.md lost its `<!-- hf-s3-example -->` Python block"
    return found.group(1)


def test_a_set_in_s3_loads_through_fsspec_as_the_readme_shows(two_sets, s3_server, tmp_path):
    lake, rows = two_sets
    s3_server.client().create_bucket(Bucket="zero-lake")
    for path in sorted(p for p in lake.rglob("*") if p.is_file()):
        s3_server.client().upload_file(str(path), "zero-lake", path.relative_to(lake).as_posix())
    code = readme_s3_block()
    assert "s3://zero-lake/arrow_shards/<fp16>" in code
    code = code.replace("s3://zero-lake/arrow_shards/<fp16>", "s3://zero-lake/arrow_shards/second")
    code += textwrap.dedent(
        """
        import json
        print("LOADED", json.dumps({
            split: {"keys": list(data["key"]), "objects": list(data["objects"]), "category": type(
                data.features["objects"]["category"].feature).__name__}
            for split, data in shard_set.items()
        }))
        """
    )
    env = {**os.environ, **s3_server.env(), "HF_HOME": str(tmp_path / "hf")}
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    loaded = json.loads(result.stdout.split("LOADED ", 1)[1])
    live = shard_hf_remote.load_live(lake / "arrow_shards" / "second")
    assert sorted(key for split in loaded.values() for key in split["keys"]) == sorted(row["key"] for row in rows)
    for split, data in live.items():
        assert loaded[split]["keys"] == list(data["key"]), f"{split}: the live rows, in manifest order"
        assert loaded[split]["objects"] == list(data["objects"]) and loaded[split]["category"] == "ClassLabel"
    assert not (tmp_path / "hf").exists() or any((tmp_path / "hf").rglob("*.arrow")), "prepared in its own cache"


def test_a_set_in_s3_streams_the_same_live_rows_without_preparing_it(two_sets, s3_server, tmp_path, monkeypatch):
    from training_code.lib.shard_hf_remote import load_url

    lake, _ = two_sets
    client = s3_server.client()
    client.create_bucket(Bucket="zero-stream")
    for path in sorted(p for p in lake.rglob("*") if p.is_file()):
        client.upload_file(str(path), "zero-stream", path.relative_to(lake).as_posix())
    for key, value in s3_server.env().items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    streamed = load_url(
        "s3://zero-stream/arrow_shards/second", {"endpoint_url": s3_server.endpoint_url}, streaming=True
    )
    live = shard_hf_remote.load_live(lake / "arrow_shards" / "second")
    assert set(streamed) == set(live) and len(live["train"])
    for split, data in live.items():
        rows = list(streamed[split])
        assert [row["key"] for row in rows] == list(data["key"]), f"{split}: the live rows, in manifest order"
        assert [row["objects"] for row in rows] == list(data["objects"])
    assert not list((tmp_path / "hf").rglob("*.arrow")), "nothing prepared in the cache"


SEPARATE_CHECK = """
import json, sys
import datasets
loaded = datasets.load_from_disk(sys.argv[1])
objects = loaded["train"].features["objects"]
print(json.dumps({
    "datasets": datasets.__file__,
    "project_importable": __import__("importlib.util").util.find_spec("training_code") is not None,
    "category": type(objects["category"].feature).__name__,
    "names": objects["category"].feature.names,
    "rows": {split: data.select_columns(["boxes", "objects"]).to_list() for split, data in loaded.items()},
}))
"""


def lock_pins(*names: str) -> list[str]:
    pins = [line for line in (REPO / "requirements.lock").read_text().splitlines() if "==" in line]
    return [pin for pin in pins if pin.split("==")[0].lower() in names]


def separate_datasets(venv: Path) -> Path:
    """A venv of its own holding datasets and pyarrow (and their dependencies) only, at the lock's
    versions: installed from the wheel cache, which is filled from the package index once."""
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    pins = lock_pins("datasets", "pyarrow")
    install = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    constraints = ["-c", str(REPO / "requirements.lock"), *pins]
    offline = subprocess.run(
        [*install, "--no-index", "--find-links", str(WHEELS), *constraints], capture_output=True, timeout=600
    )
    if offline.returncode != 0:  # the cache lacks a wheel: fill it, then install from it
        download = [str(python), "-m", "pip", "download", "--quiet", "--disable-pip-version-check"]
        subprocess.run([*download, "-d", str(WHEELS), *constraints], check=True, timeout=900)
        subprocess.run([*install, "--no-index", "--find-links", str(WHEELS), *constraints], check=True, timeout=600)
    return python


@pytest.mark.slow
def test_a_separate_datasets_install_sees_objects_with_bbox_and_a_classlabel_category(two_sets, tmp_path):
    lake, _ = two_sets
    python = separate_datasets(tmp_path / "venv")
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "VIRTUAL_ENV")}
    result = subprocess.run(
        [str(python), "-c", SEPARATE_CHECK, str(lake / "arrow_shards" / "second")],
        cwd=tmp_path,
        env={**env, "HF_HOME": str(tmp_path / "hf")},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    seen = json.loads(result.stdout)
    assert seen["datasets"].startswith(str(tmp_path / "venv")) and not seen["project_importable"], seen["datasets"]
    assert seen["category"] == "ClassLabel" and seen["names"] == ["__background__", *NAMES]
    rows = [row for split in seen["rows"].values() for row in split]
    assert rows and all(row["objects"]["bbox"] == [coco(box) for box in row["boxes"]] for row in rows)


def test_a_set_of_the_earlier_format_is_refused_naming_what_it_lacks_and_packed_again(two_sets, tmp_path):
    lake, rows = two_sets
    earlier = tmp_path / "arrow_shards" / "earlier"
    shutil.copytree(lake / "arrow_shards" / "first", earlier)
    manifest = json.loads((earlier / "manifest.json").read_text())
    (earlier / "manifest.json").write_text(json.dumps({**manifest, "format": "zero-shards/3"}))
    with pytest.raises(ValueError, match=r"'zero-shards/3' is not 'zero-shards/4' \(its shards have no `objects`"):
        read_manifest(earlier)
    raw = lake.parent / "raw"  # the fixture's raw root, beside its lake
    _, work = build_shards(
        write_selection(tmp_path / "selection", rows, NAMES),
        raw,
        tmp_path / "arrow_shards" / "next",
        2000,
        previous=earlier,
        previous_name="earlier",
    )
    assert work["shards_kept"] == 0 and work["rows_packed"] == len(rows), "no shard without `objects` is kept"

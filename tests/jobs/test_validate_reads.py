"""The validation job reads what the index listed: in-process runs of the pass (and of its map and reduce
stages) on a raw root edited after its index, and the raw-file reader's own checks."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pytest

from training_code.lib.coco import ANNOTATIONS_FILE
from training_code.lib.image_checks import ImageVerdict, check_image_file
from training_code.lib.raw_files import RAW_CHANGED, RawChanged, RawRootChanged, read_limited
from training_code.lib.raw_index import whole_root_manifest
from training_code.lib.storage import list_objects, local_etag
from training_code.lib.tables import RAW_INDEX, write_table
from training_code.lib.validation_pass import MANIFEST, collect_map_verdicts, validate
from training_code.lib.verdict_cache import VERDICTS_FILE
from training_code.validate import get_args_parser

NAMES = [f"lot_{n % 2}/img_{n}.jpg" for n in range(4)]


def check_that_denies(path: str, allowed_formats, min_side, **limits) -> ImageVerdict:
    """The real check, except that files named denied* cannot be read, as a permission problem would
    make them for any user but root (the tests may run as root, which no mode bit stops)."""
    if Path(path).name.startswith("denied"):
        return ImageVerdict.unread("unreadable", "PermissionError: Permission denied")
    return check_image_file(path, allowed_formats, min_side, **limits)


def jpeg(seed: int) -> bytes:
    import io

    import numpy as np
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(np.random.default_rng(seed).integers(0, 255, (48, 64, 3), dtype=np.uint8)).save(buffer, "JPEG")
    return buffer.getvalue()


def make_raw(raw: Path, names: list[str] = NAMES) -> None:
    coco = {"images": [], "annotations": [], "categories": [{"id": 1, "name": "part"}]}
    for n, name in enumerate(names, start=1):
        (raw / "cam" / name).parent.mkdir(parents=True, exist_ok=True)
        (raw / "cam" / name).write_bytes(jpeg(n))
        coco["images"].append({"id": n, "file_name": name})
        coco["annotations"].append({"id": n, "image_id": n, "category_id": 1, "bbox": [4, 4, 20, 20]})
    (raw / "cam" / ANNOTATIONS_FILE).write_text(json.dumps(coco))


def index(raw: Path, index_dir: Path) -> None:
    rows = [
        {"source": "cam", "key": o.key, "size": o.size, "etag": o.etag, "group": o.key.rsplit("/", 1)[0]}
        for o in list_objects(raw)
        if not o.key.endswith(ANNOTATIONS_FILE)
    ]
    write_table(pd.DataFrame(rows).assign(annotation_count=1), RAW_INDEX, index_dir / "index.parquet")
    (index_dir / "manifest.json").write_text(json.dumps(whole_root_manifest(str(raw), ["cam"])))


def arguments(tmp_path: Path, out: str = "out", *extra: str):
    return get_args_parser().parse_args(
        ["--index", str(tmp_path / "index"), "--raw", str(tmp_path / "raw"), "--out", str(tmp_path / out)]
        + ["--workers", "1", *extra]
    )


@pytest.fixture
def indexed(tmp_path) -> Path:
    make_raw(tmp_path / "raw")
    index(tmp_path / "raw", tmp_path / "index")
    return tmp_path / "raw" / "cam"


def assert_fails_naming(tmp_path: Path, key: str, what: str) -> None:
    with pytest.raises(RawRootChanged, match="rematerialize raw_image_index for cam") as failed:
        validate(arguments(tmp_path))
    assert f"{key}: " in str(failed.value) and what in str(failed.value), str(failed.value)
    assert not (tmp_path / "out" / MANIFEST).exists() and not (tmp_path / "out" / VERDICTS_FILE).exists()


def test_an_image_edited_after_the_index_fails_the_pass_naming_it(tmp_path, indexed):
    (indexed / NAMES[2]).write_bytes(jpeg(99))  # another mtime (and size)
    assert_fails_naming(tmp_path, f"cam/{NAMES[2]}", "the index listed")


def test_an_image_gone_since_the_index_fails_the_pass(tmp_path, indexed):
    (indexed / NAMES[1]).unlink()
    assert_fails_naming(tmp_path, f"cam/{NAMES[1]}", "gone")


def test_an_annotations_file_edited_appearing_or_gone_fails_the_pass(tmp_path, indexed):
    annotations = indexed / ANNOTATIONS_FILE
    original, stat = annotations.read_bytes(), annotations.stat()
    annotations.write_bytes(original.replace(b"[4, 4, 20, 20]", b"[4, 4, 20, 21]"))  # same size
    os.utime(annotations, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # and the indexed mtime: only the bytes differ
    assert_fails_naming(tmp_path, "cam/annotations.json", "sha256 differs")
    annotations.unlink()
    assert_fails_naming(tmp_path, "cam/annotations.json", "gone")
    index(tmp_path / "raw", tmp_path / "index")  # indexed without one
    annotations.write_bytes(original)
    assert_fails_naming(tmp_path, "cam/annotations.json", "not when the index was built")


def test_an_index_without_its_manifest_is_refused_before_any_work(tmp_path, indexed):
    (tmp_path / "index" / "manifest.json").unlink()
    with pytest.raises(FileNotFoundError, match="manifest.json is missing.*rematerialize raw_image_index"):
        validate(arguments(tmp_path))


def test_unreadable_images_are_recorded_and_decoded_again_next_time(tmp_path):
    make_raw(tmp_path / "raw", [*NAMES, "lot_0/denied.jpg"])
    index(tmp_path / "raw", tmp_path / "index")
    manifest, _, work, _ = validate(arguments(tmp_path, "first"), check=check_that_denies)
    assert work == {"decoded": 5, "reused": 0}
    assert manifest["counts"]["images_to_retry"] == 1 and manifest["counts"]["quarantined_by_reason"] == {
        "unreadable": 1
    }
    assert manifest["retry_next_time"]["count"] == 1 and "could not be read" in manifest["retry_next_time"]["why"]
    _, _, work, _ = validate(
        arguments(tmp_path, "again", "--previous", str(tmp_path / "first")), check=check_image_file
    )
    assert work == {"decoded": 1, "reused": 4}, "only the unreadable image is decoded again"
    again = json.loads((tmp_path / "again" / MANIFEST).read_text())
    assert again["counts"]["images_to_retry"] == 0 and "retry_next_time" not in again


def test_a_key_no_map_host_received_fails_the_reduce(tmp_path):
    pending = pa.table({"key": ["cam/a.jpg", "cam/b.jpg"], "etag": ["1-1", "2-2"], "size": [1, 2]})
    verdicts = pd.DataFrame(
        {
            "key": ["cam/a.jpg"],
            "etag": ["1-1"],
            "listed_size": [1],
            **{c: [v] for c, v in {"sha256": "a" * 64, "size": 1, "reason": "", "stage": "decode"}.items()},
            **{c: [v] for c, v in {"error": "", "format": "JPEG", "mode": "RGB", "width": 9, "height": 9}.items()},
            "orientation": [1],
            "phash": [[1, 2, 3]],
            "dhash": [[4, 5, 6]],
        }
    )
    (tmp_path / "decoded").mkdir()
    verdicts.to_parquet(tmp_path / "decoded" / "verdicts-algo-1.parquet", index=False)
    with pytest.raises(RawRootChanged, match=r"cam/b.jpg: listed by the index, but no host of the map stage"):
        collect_map_verdicts(tmp_path / "decoded", pending)


def test_the_reader_proves_it_read_the_listed_file(tmp_path):
    path = tmp_path / "a.jpg"
    path.write_bytes(b"listed")
    listed = local_etag(path.stat())
    assert read_limited(path, 100, listed) == b"listed"
    time.sleep(0.01)
    path.write_bytes(b"edited")  # same size, another mtime
    with pytest.raises(RawChanged, match="the index listed") as changed:
        read_limited(path, 100, listed)
    assert changed.value.reason == RAW_CHANGED
    path.unlink()
    with pytest.raises(RawChanged, match="gone"):
        read_limited(path, 100, listed)
    with pytest.raises(FileNotFoundError):  # without a listing, a missing file stays an OSError (unreadable)
        read_limited(path, 100)
    verdict = check_image_file(path, ("JPEG",), 8, listed_etag=listed)
    assert verdict.reason == RAW_CHANGED, "handed back as a verdict the pass fails on, never recorded"

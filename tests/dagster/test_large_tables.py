"""Tables are verified by sha256 at any size: a same-size edit in a real Parquet table over 16 MiB (the
threshold is not lowered) is a cache miss and fails its reader, while shards past the threshold stay
checked by size on a hit and are not read there (their readers verify them)."""

import json
import os
import shutil
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from dagster import AssetExecutionContext, DataVersion, MaterializeResult, asset, materialize

from training_code.lib.hashing import sha256_bytes, sha256_file
from training_code.lib.storage import write_bytes_atomic
from training_code.lib.tables import ACCEPTED, read_table, write_table
from training_code.lib.verified_read import FileIntegrityError
from zero_assets.core.fingerprints import FingerprintInputs
from zero_assets.core.job_request import output_lease_location
from zero_assets.core.output_marker import (
    OUTPUT_MARKER,
    SMALL_FILE_BYTES,
    complete_marker,
    mark_output_complete,
    output_is_complete,
)
from zero_assets.launch.once import materialize_once

ROWS = 180_000  # about 20 MiB of Parquet: random hashes and keys do not compress
FP = "f" * 64


def accepted_frame(rows: int) -> pd.DataFrame:
    """A validated_images accepted table of `rows` distinct images."""
    rng = np.random.default_rng(7)
    hashes = [rng.bytes(32).hex() for _ in range(rows)]
    return pd.DataFrame(
        {
            "source": "line_a_camera",
            "key": [f"line_a_camera/{h[:24]}.jpg" for h in hashes],
            "sha256": hashes,
            "size": rng.integers(1_000, 1_000_000, rows),
            "format": "JPEG",
            "mode": "RGB",
            "width": 640,
            "height": 480,
            "orientation": 1,
            "group": [h[24:40] for h in hashes],
            "split": "train",
            "boxes": [[[1.0, 2.0, 30.0, 40.0]]] * rows,
            "category_names": [["widget"]] * rows,
            "annotation": "annotated",
            "phash": [[0, 0, 0]] * rows,
            "dhash": [[0, 0, 0]] * rows,
        }
    )


@pytest.fixture(scope="module")
def validated(tmp_path_factory) -> Path:
    """A validated_images output as the job leaves it: `accepted.parquet` over 16 MiB, manifest last
    (its `files` as name -> sha256, the validation manifest's shape)."""
    folder = tmp_path_factory.mktemp("validated")
    write_table(accepted_frame(ROWS), ACCEPTED, folder / "accepted.parquet")
    manifest = {"format": "zero-validated/1", "files": {"accepted.parquet": sha256_file(folder / "accepted.parquet")}}
    write_bytes_atomic(folder / "manifest.json", json.dumps(manifest).encode())
    assert (folder / "accepted.parquet").stat().st_size > SMALL_FILE_BYTES
    return folder


def edit_one_hash_in_place(table: Path) -> tuple[str, str]:
    """Replace one row's sha256 in the Parquet bytes by another of the same length, keeping the file's
    size and mtime: an edit only the bytes show. Returns (old, new) value."""
    data = bytearray(table.read_bytes())
    for old in pd.read_parquet(table, columns=["sha256"])["sha256"]:
        if data.count(old.encode()) == 1:  # stored as a literal (not folded into a compressed match)
            break
    new = old[::-1]
    at = data.index(old.encode())
    data[at : at + len(old)] = new.encode()
    stat = table.stat()
    table.write_bytes(bytes(data))
    os.utime(table, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert table.stat().st_size == stat.st_size and table.stat().st_mtime_ns == stat.st_mtime_ns
    return old, new


def large_table_asset(built_from: Path, lake: Path):
    """An asset whose output is `built_from`'s files, through the one materialize-once protocol."""

    @asset(name="large_table")
    def large_table(context: AssetExecutionContext) -> MaterializeResult:
        inputs = FingerprintInputs("test-code", {"rows": ROWS}, {})
        out = lake / "large_table" / inputs.fingerprint[:16]

        def build() -> MaterializeResult:
            shutil.copytree(built_from, out, dirs_exist_ok=True)
            version = sha256_bytes((out / "manifest.json").read_bytes())
            return MaterializeResult(metadata={"dagster/row_count": ROWS}, data_version=DataVersion(version))

        lease = output_lease_location(lake / "_jobs", "large_table", inputs.fingerprint, str(out))
        return materialize_once(context, inputs=inputs, output=str(out), lease=lease, build=build)

    return large_table


def cache_of(result) -> tuple[str, str]:
    [event] = result.get_asset_materialization_events()
    metadata = event.materialization.metadata
    return metadata["cache"].value, metadata["cache_reason"].value


def test_a_same_size_edit_in_a_table_over_16_mib_is_a_cache_miss(validated, tmp_path, instance):
    lake = tmp_path / "lake"
    large_table = large_table_asset(validated, lake)
    assert cache_of(materialize([large_table], instance=instance))[0] == "miss"
    assert cache_of(materialize([large_table], instance=instance))[0] == "hit"
    [out] = (lake / "large_table").iterdir()

    old, new = edit_one_hash_in_place(out / "accepted.parquet")
    assert new in set(pd.read_parquet(out / "accepted.parquet")["sha256"]), "a plain Parquet reader takes the edit"
    cache, reason = cache_of(materialize([large_table], instance=instance))
    assert cache == "miss" and "missing or incomplete" in reason, reason
    # The rebuild published the job's bytes again; the next materialization is a hit on them.
    assert sha256_file(out / "accepted.parquet") == sha256_file(validated / "accepted.parquet")
    assert old in set(read_table(out / "accepted.parquet", ACCEPTED)["sha256"].to_pylist())
    assert cache_of(materialize([large_table], instance=instance))[0] == "hit"


def test_a_table_over_16_mib_is_verified_by_its_reader(validated, tmp_path):
    folder = tmp_path / "validated"
    shutil.copytree(validated, folder)
    assert len(read_table(folder / "accepted.parquet", ACCEPTED)) == ROWS
    edit_one_hash_in_place(folder / "accepted.parquet")
    with pytest.raises(FileIntegrityError, match=rf"{folder / 'accepted.parquet'}: sha256 [0-9a-f]{{64}}, .*manifest"):
        read_table(folder / "accepted.parquet", ACCEPTED)
    # A table no manifest names (a map stage's part, the verdict cache's table) has nothing to be checked against.
    shutil.copy(folder / "accepted.parquet", tmp_path / "part.parquet")
    assert len(read_table(tmp_path / "part.parquet", ACCEPTED)) == ROWS


class FileOpens:
    """Records every open() of a file under `root` in this process (audit hooks cannot be removed: gate them)."""

    active: "FileOpens | None" = None

    def __init__(self, root: Path) -> None:
        self.root, self.names = str(root), set()

    def __enter__(self) -> "FileOpens":
        FileOpens.active = self
        return self

    def __exit__(self, *exc) -> None:
        FileOpens.active = None


def _audit(event, args):
    watcher = FileOpens.active
    if watcher is not None and event == "open" and isinstance(args[0], (str, os.PathLike)):
        path = str(args[0])
        if path.startswith(watcher.root):
            watcher.names.add(Path(path).name)


sys.addaudithook(_audit)


def test_a_hit_hashes_tables_at_any_size_and_never_reads_a_large_shard(validated, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(validated, out)
    shard = out / "train-00000.arrow"
    with open(shard, "wb") as handle:  # a shard past the threshold (its contents are its readers' to check)
        handle.truncate(SMALL_FILE_BYTES + 1)
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["shards"] = [{"file": shard.name, "bytes": shard.stat().st_size, "sha256": "0" * 64}]
    write_bytes_atomic(out / "manifest.json", json.dumps(manifest).encode())
    marker = mark_output_complete(str(out), FP)
    assert "sha256" in marker["files"]["accepted.parquet"] and "sha256" not in marker["files"][shard.name]
    with FileOpens(out) as opened:
        assert complete_marker(str(out), FP) is not None
    assert {"accepted.parquet", "manifest.json"} <= opened.names and shard.name not in opened.names


def test_a_marker_that_did_not_hash_a_large_table_vouches_for_nothing(validated, tmp_path):
    """Markers written before tables were hashed at any size recorded a large one by size only."""
    out = tmp_path / "out"
    shutil.copytree(validated, out)
    marker = mark_output_complete(str(out), FP)
    assert output_is_complete(str(out), FP)
    del marker["files"]["accepted.parquet"]["sha256"]
    write_bytes_atomic(out / OUTPUT_MARKER, json.dumps(marker).encode())
    assert not output_is_complete(str(out), FP)

"""A shard set lists shards kept in earlier sets' folders: the output marker vouches for them (a hit
proves the whole set present), and readers resolve them from the manifest's folder and refuse a path
that leaves the root."""

import json
import shutil
from pathlib import Path

import pytest
from helpers.selections import write_selection
from test_shard_job import _rows

from training_code.lib.detection_samples import verified_split
from training_code.lib.relative_paths import resolve, split_relative
from training_code.shard import build_shards
from zero_assets.core.output_marker import OutputNotComplete, mark_output_complete, output_is_complete


@pytest.fixture
def two_sets(tmp_path) -> tuple[Path, Path, Path]:
    """`first` packs eight images, `second` keeps its shards and packs four more: arrow_shards' layout."""
    raw, lake = tmp_path / "raw", tmp_path / "lake" / "arrow_shards"
    rows = _rows(raw, images=12)
    write_selection(tmp_path / "s1", rows[:8], ["washer"])
    write_selection(tmp_path / "s2", rows, ["washer"])
    build_shards(tmp_path / "s1", raw, lake / "first", 300)
    build_shards(tmp_path / "s2", raw, lake / "second", 300, previous=lake / "first", previous_name="first")
    return raw, lake / "first", lake / "second"


def test_the_marker_vouches_for_the_shards_kept_in_an_earlier_folder(two_sets):
    _, first, second = two_sets
    manifest = json.loads((second / "manifest.json").read_text())
    kept = [e for e in manifest["shards"] if e["path"].startswith("../first/")]
    assert kept and len(kept) < len(manifest["shards"])
    marker = mark_output_complete(str(second), "f" * 64, "v")
    assert {name for name in marker["files"] if name.startswith("../")} == {e["path"] for e in kept}
    assert output_is_complete(str(second), "f" * 64)

    victim = first / kept[0]["path"].removeprefix("../first/")
    data = victim.read_bytes()
    victim.write_bytes(data[:-1])  # truncated where it was packed: the set that keeps it is not complete
    assert not output_is_complete(str(second), "f" * 64)
    with pytest.raises(OutputNotComplete, match=kept[0]["path"]):
        mark_output_complete(str(second), "f" * 64, "v")
    victim.unlink()
    with pytest.raises(OutputNotComplete, match=f"{kept[0]['path']} is named by manifest.json but missing"):
        mark_output_complete(str(second), "f" * 64, "v")


def test_readers_resolve_kept_shards_and_refuse_a_path_out_of_the_root(two_sets, tmp_path):
    _, _, second = two_sets
    manifest, refs = verified_split(second, "train")
    assert any("/first/shards/" in str(ref.path) for ref in refs) and all(ref.path.is_file() for ref in refs)
    # Inside a channel (--training-set), the channel is the root: the same set read as SageMaker lays it out.
    channel = tmp_path / "channel"
    shutil.copytree(second.parent, channel / "arrow_shards")
    _, inside = verified_split(channel, "train", training_set_dir="arrow_shards/second")
    assert [ref.rows for ref in inside] == [ref.rows for ref in refs]
    with pytest.raises(ValueError, match="outside"):
        verified_split(channel / "arrow_shards" / "second", "train", training_set_dir=".")  # `../first` leaves it
    assert split_relative("../../shards/a.arrow") == (2, "shards/a.arrow")
    for bad in ("../x/../y.arrow", "/etc/passwd", "shards//a.arrow", "./a.arrow"):
        with pytest.raises(ValueError):
            split_relative(bad)
    assert (
        resolve("s3://bucket/lake/arrow_shards/b", "../a/shards/x.arrow")
        == "s3://bucket/lake/arrow_shards/a/shards/x.arrow"
    )
    with pytest.raises(ValueError, match="leaves bucket"):
        resolve("s3://bucket/a", "../../x.arrow")
    assert manifest["rows"]["train"] == sum(ref.live_rows for ref in refs)

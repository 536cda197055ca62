"""The rehearsal profile indexes a small, stable sample of whole groups (of each source it indexes)."""

from graph_runs import materialize_source
from zero_assets.assets import raw_image_index
from zero_assets.raw_index import build_raw_index, sample_by_group
from zero_assets.resources import ZeroSettings


def test_rehearsal_sample_keeps_whole_groups_and_is_stable(tiny_raw_root):
    frame = build_raw_index(str(tiny_raw_root)).frame
    sample = sample_by_group(frame, images=10)
    assert 10 <= len(sample) < len(frame)
    for group in sample["group"].unique():  # a group is in the sample whole or not at all
        assert (sample["group"] == group).sum() == (frame["group"] == group).sum()
    shuffled = frame.sample(frac=1, random_state=1)
    assert set(sample_by_group(shuffled, images=10)["key"]) == set(sample["key"]), "row order does not change the sample"


def test_raw_index_asset_applies_the_sample(tiny_raw_root, tmp_path, instance):
    settings = ZeroSettings(raw_uri=str(tiny_raw_root), lake_uri=str(tmp_path / "lake"), sample_images=5)
    result = materialize_source("line_a_camera", instance=instance, resources={"settings": settings}, assets=[raw_image_index])
    metadata = result.asset_materializations_for_node("raw_image_index")[0].metadata
    assert 5 <= metadata["images"].value < len(build_raw_index(str(tiny_raw_root), source="line_a_camera").frame)

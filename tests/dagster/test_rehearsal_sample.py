"""The rehearsal profile indexes a small, stable sample of whole groups (of each source it indexes)."""

import pandas as pd
from helpers.graph_runs import materialize_source

from training_code.lib.raw_index import write_source_index
from zero_assets.backends.local.runner import LocalJobRunner
from zero_assets.core.settings import ZeroSettings
from zero_assets.defs.assets import raw_image_index

SOURCE = "line_a_camera"


def _index(raw, out, sample_images=None) -> pd.DataFrame:
    write_source_index(str(raw), SOURCE, out, sample_images=sample_images)
    return pd.read_parquet(out / "index.parquet")


def test_rehearsal_sample_keeps_whole_groups_and_is_stable(tiny_raw_root, tmp_path):
    frame = _index(tiny_raw_root, tmp_path / "all")
    sample = _index(tiny_raw_root, tmp_path / "ten", sample_images=10)
    assert 10 <= len(sample) < len(frame)
    for group in sample["group"].unique():  # a group is in the sample whole or not at all
        assert (sample["group"] == group).sum() == (frame["group"] == group).sum()
    larger = _index(tiny_raw_root, tmp_path / "twenty", sample_images=20)
    assert set(sample["key"]) <= set(larger["key"]), (
        "groups are taken in a fixed order: a larger sample keeps the smaller one"
    )
    assert _index(tiny_raw_root, tmp_path / "again", sample_images=10).equals(sample)


def test_raw_index_asset_applies_the_sample(tiny_raw_root, tmp_path, instance):
    settings = ZeroSettings(raw_uri=str(tiny_raw_root), lake_uri=str(tmp_path / "lake"), sample_images=5)
    resources = {"settings": settings, "jobs": LocalJobRunner(settings=settings)}
    result = materialize_source(SOURCE, instance=instance, resources=resources, assets=[raw_image_index])
    metadata = result.asset_materializations_for_node("raw_image_index")[0].metadata
    assert 5 <= metadata["dagster/row_count"].value < len(_index(tiny_raw_root, tmp_path / "all"))
    assert len(pd.read_parquet(f"{metadata['dagster/uri'].value}/index.parquet")) == metadata["dagster/row_count"].value

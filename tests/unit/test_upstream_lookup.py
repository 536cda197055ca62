"""`latest_by_partition`: each source's newest materialization in two queries, the same records the
per-source lookup finds."""

from dagster import AssetMaterialization

from zero_assets.launch.upstream import latest_by_partition, latest_materializations


def _report(instance, asset: str, partition: str, run: int) -> None:
    instance.report_runless_asset_event(
        AssetMaterialization(asset_key=asset, partition=partition, metadata={"run": run})
    )


def test_each_partition_gets_its_newest_materialization_of_that_asset_only(instance):
    # Interleaved: a source's newest is not the newest overall, and another asset shares the sources' names.
    for run, (asset, source) in enumerate(
        [
            ("validated_images", "cam_a"),
            ("validated_images", "cam_b"),
            ("validated_images", "cam_a"),
            ("raw_image_index", "cam_a"),
            ("validated_images", "cam_c"),
            ("raw_image_index", "cam_b"),
            ("validated_images", "cam_b"),
            ("raw_image_index", "cam_d"),
        ]
    ):
        _report(instance, asset, source, run)

    found = latest_by_partition(instance, "validated_images", ["cam_a", "cam_b", "cam_d", "never_registered"])

    assert {source: record.asset_materialization.metadata["run"].value for source, record in found.items()} == {
        "cam_a": 2,
        "cam_b": 6,
    }
    for source, record in found.items():
        assert record.storage_id == latest_materializations(instance, "validated_images", source)[0].storage_id
    assert latest_by_partition(instance, "validated_images", []) == {}
    assert latest_by_partition(instance, "validated_images", ["cam_d"]) == {}, "cam_d has only an index"
    assert latest_by_partition(instance, "arrow_shards", ["cam_a"]) == {}

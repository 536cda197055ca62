"""Every validated_images page says which sources have quarantined images on a contact sheet, so the
page of a source without one (nothing quarantined, or nothing that still decodes) points at those."""

from dagster import AssetMaterialization

from zero_assets.defs.assets.validated_images import ENTRY, contact_sheets_entry
from zero_assets.defs.partitions import RAW_SOURCES


def test_a_source_without_a_sheet_names_the_sources_that_have_one(instance):
    instance.add_dynamic_partitions(RAW_SOURCES.name, ["line_a_camera", "line_b_camera", "warehouse_scanner", "new"])
    for source, quarantined, shown in (("line_a_camera", 2, 1), ("line_b_camera", 0, 0)):
        metadata = {"quarantined": quarantined, "quarantined_images_shown": shown}
        instance.report_runless_asset_event(
            AssetMaterialization(asset_key="validated_images", partition=source, metadata=metadata)
        )
    table = contact_sheets_entry(instance, "warehouse_scanner", {"quarantined": 1, "quarantined_images_shown": 0})
    rows = table[ENTRY].value.splitlines()[2:]
    assert rows == [
        "| line_a_camera | 1 of 2 on its contact sheet |",
        "| line_b_camera | none quarantined |",
        "| new | not validated yet |",
        "| warehouse_scanner (this source) | 1 quarantined, none that still decodes: no sheet |",
    ]

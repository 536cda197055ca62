"""The Dagster side of the raw image index: `write_source_index` (training_code/lib/raw_index.py) indexes
one source, streamed into Parquet, in this process or as the job training_code/index.py, and
`source_listing_fingerprint` gives its listing fingerprint first when a job is to build it.
"""

from __future__ import annotations

from training_code.lib.annotation_files import count_source_annotations
from training_code.lib.coco import DEFAULT_MAX_ANNOTATION_BYTES
from training_code.lib.raw_index import _ListingPass
from training_code.lib.raw_index_listing import check_source, list_source

__all__ = ["source_listing_fingerprint"]


def source_listing_fingerprint(raw_uri: str, source: str, *, max_annotation_bytes: int = DEFAULT_MAX_ANNOTATION_BYTES,
                               inventory_manifest_uri: str | None = None) -> str:
    """The `listing_fingerprint` write_source_index would record for `<raw_uri>/<source>/`, from one
    streamed pass over that source's listing (nothing written, no list of keys kept): what the asset
    needs before it decides whether a job must build the index at all."""
    check_source(source)
    listing = _ListingPass(source, None, count_source_annotations(raw_uri, source, max_annotation_bytes))
    for _ in listing.batches(list_source(raw_uri, source, inventory_manifest_uri)):
        pass
    return listing.fingerprint()

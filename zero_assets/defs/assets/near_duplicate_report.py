"""What training_set shows of its near-duplicate groups: counts, a table of their first images, a contact sheet.

The contact sheet draws the first `SHEET_GROUPS` groups (by their first image's source and key), one
inline picture a group with up to `SHEET_IMAGES` of its images side by side, each image's split under
it. These are accepted images (validation decoded them under its limits); each is read from the raw
root by its key, checked against the sha256 the selection records, and drawn reduced (JPEG draft, or
`reduce`). An image that cannot be read or no longer matches is drawn as a grey tile saying so.
"""

from __future__ import annotations

import io

import pyarrow as pa
import pyarrow.compute as pc
from dagster import MetadataValue, TableColumn, TableRecord, TableSchema
from PIL import Image, ImageDraw, ImageOps

from training_code.lib.hashing import sha256_bytes
from training_code.lib.inline_pictures import inline_picture
from training_code.lib.near_duplicate_split import near_duplicate_counts
from training_code.lib.storage import join, read_bytes

TABLE_ROWS = 40  # images listed in the UI's table; the whole list is near_duplicates.parquet
SHEET_GROUPS = 4
SHEET_IMAGES = 3
TILE = 96
CAPTION = 12
COLUMN_MEANINGS = {
    "near_duplicate_of": "the group's first image (by source, then key)",
    "source": "the image's source",
    "key": "the image",
    "group": "its validation group",
    "validated_split": "the split validation gave its group",
    "split": "the split it trains in: that of the group linked to it that sorts first",
}


def near_duplicate_metadata(members: pa.Table, selected: pa.Table, raw_uri: str) -> dict[str, object]:
    """Counts, the table and the contact sheet of the near-duplicate `members` (NEAR_DUPLICATES_SCHEMA
    rows) of the selection `selected` (for each image's sha256)."""
    metadata: dict[str, object] = dict(near_duplicate_counts(members))
    shown = members.slice(0, TABLE_ROWS).to_pylist()
    metadata["near_duplicates"] = MetadataValue.table(
        records=[TableRecord({name: row[name] for name in COLUMN_MEANINGS}) for row in shown],
        schema=TableSchema([TableColumn(name, "string", meaning) for name, meaning in COLUMN_MEANINGS.items()]),
    )
    sha256_of = dict(zip(selected.column("key").to_pylist(), selected.column("sha256").to_pylist()))
    firsts = pc.unique(members.column("near_duplicate_of")).to_pylist()[:SHEET_GROUPS]
    for number, first in enumerate(firsts, start=1):
        group = members.filter(pc.equal(members.column("near_duplicate_of"), first)).slice(0, SHEET_IMAGES)
        strip = group_strip([(row["key"], sha256_of[row["key"]], row["split"]) for row in group.to_pylist()], raw_uri)
        size = pc.sum(pc.equal(members.column("near_duplicate_of"), first)).as_py()
        caption = f"{size} near-duplicates of {first}"
        metadata[f"near_duplicate_group_{number}"] = MetadataValue.md(inline_picture(strip, caption, caption))
    return metadata


def group_strip(images: list[tuple[str, str, str]], raw_uri: str) -> Image.Image:
    """(key, sha256, split) images side by side, each reduced to a TILE square with its split under it."""
    strip = Image.new("RGB", (TILE * len(images), TILE + CAPTION), "white")
    draw = ImageDraw.Draw(strip)
    for position, (key, sha256, split) in enumerate(images):
        strip.paste(tile(join(raw_uri, key), sha256), (position * TILE, 0))
        draw.text((position * TILE + 2, TILE), split, fill=(200, 30, 30) if split == "val" else (20, 90, 20))
    return strip


def tile(uri: str, sha256: str) -> Image.Image:
    """The image at `uri` within a TILE square, or a grey tile when it is gone or not the selected bytes."""
    try:
        data = read_bytes(uri)
    except (FileNotFoundError, OSError):
        return _blank("unread")
    if sha256_bytes(data) != sha256:
        return _blank("changed")
    with Image.open(io.BytesIO(data)) as image:
        image.draft("RGB", (TILE, TILE))  # a JPEG decodes reduced; other formats reduce() in thumbnail
        image.thumbnail((TILE, TILE))
        upright = ImageOps.exif_transpose(image).convert("RGB")  # as training sees it
        picture = Image.new("RGB", (TILE, TILE), "white")
        picture.paste(upright, (0, 0))
    return picture


def _blank(text: str) -> Image.Image:
    picture = Image.new("RGB", (TILE, TILE), (200, 200, 200))
    ImageDraw.Draw(picture).text((4, TILE // 2), text, fill="black")
    return picture

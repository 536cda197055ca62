"""What the selection job reports of its near-duplicate clusters: counts, a table of their images, a contact sheet.

An image on the sheet is read by key and checked against the selected sha256; an unreadable or changed one is grey."""

from __future__ import annotations

import io
from typing import Any

from PIL import Image, ImageDraw, ImageOps

from .hashing import sha256_bytes
from .inline_pictures import inline_picture, markdown_metadata
from .job_env import table
from .selection_engine import quoted
from .storage import join, read_bytes

TABLE_ROWS = 40  # images listed in the UI's table; the whole list is near_duplicates.parquet
SHEET_CLUSTERS = 4
SHEET_IMAGES = 3
TILE = 96
CAPTION = 12
COLUMN_MEANINGS = {
    "cluster": "the cluster's first image (by source, then key)",
    "key": "the image",
    "group": "its validation group",
    "validated_split": "the split validation gave its group",
    "outcome": "train or val as validated, or 'left val' (it copies a train image: excluded)",
}


def near_duplicate_metadata(engine, raw_uri: str) -> dict[str, Any]:
    """Counts, the table and the contact sheet of the policy's `near_duplicates`."""
    clusters, images, largest = engine.execute(
        """SELECT count(DISTINCT cluster), count(*), coalesce(max(size), 0)
        FROM (SELECT *, count(*) OVER (PARTITION BY cluster) AS size FROM near_duplicates)"""
    ).fetchone()
    metadata: dict[str, Any] = {
        "near_duplicate_clusters": clusters,
        "near_duplicate_images": images,
        "largest_near_duplicate_cluster": largest,
    }
    shown = engine.execute(
        f"SELECT {quoted(COLUMN_MEANINGS)} FROM near_duplicates ORDER BY cluster, source, key LIMIT {TABLE_ROWS}"
    ).fetchall()
    metadata["near_duplicates"] = table([dict(zip(COLUMN_MEANINGS, row)) for row in shown], COLUMN_MEANINGS)
    firsts = engine.execute(
        f"SELECT cluster, count(*) FROM near_duplicates GROUP BY cluster ORDER BY cluster LIMIT {SHEET_CLUSTERS}"
    ).fetchall()
    for number, (first, size) in enumerate(firsts, start=1):
        members = engine.execute(
            """SELECT n.key, a.sha256, n.outcome FROM near_duplicates AS n JOIN accepted AS a USING (source, key)
            WHERE n.cluster = ? ORDER BY n.source, n.key LIMIT ?""",
            [first, SHEET_IMAGES],
        ).fetchall()
        caption = f"{size} near-duplicates of {first}"
        picture = inline_picture(cluster_strip(members, raw_uri), caption, caption)
        metadata[f"near_duplicate_cluster_{number}"] = markdown_metadata(picture)
    return metadata


def cluster_strip(images: list[tuple[str, str, str]], raw_uri: str) -> Image.Image:
    """(key, sha256, outcome) images side by side, each reduced to a TILE square with its outcome under it."""
    strip = Image.new("RGB", (TILE * len(images), TILE + CAPTION), "white")
    draw = ImageDraw.Draw(strip)
    for position, (key, sha256, outcome) in enumerate(images):
        strip.paste(tile(join(raw_uri, key), sha256), (position * TILE, 0))
        colour = (20, 90, 20) if outcome == "train" else (200, 30, 30)
        draw.text((position * TILE + 2, TILE), outcome, fill=colour)
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

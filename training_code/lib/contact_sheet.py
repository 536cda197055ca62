"""The quarantine's contact sheet: thumbnails of quarantined images that still decode, each with its reason.

Quarantined files are hostile, so they are drawn under the validator's guards: only `DRAWABLE_REASONS`,
read through `raw_files`, sha256-checked, pixel-limited, decoded reduced in the isolated pool. At most
`MAX_ATTEMPTS` tried and `MAX_THUMBNAILS` shown, first by key, so any host count gives the same sheet.
"""

from __future__ import annotations

import io
import warnings
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import pandas as pd
from PIL import Image, ImageDraw

from .hashing import sha256_bytes
from .isolated_pool import IsolatedPool, WorkerLost
from .raw_files import Refused, locate, read_limited

# Reasons where the decoder finished on the file or was stricter than Pillow (corrupt_data shows the
# garbage worth seeing); decode_error covers odd files Pillow may still draw.
DRAWABLE_REASONS = ("checksum", "corrupt_data", "decode_error", "exif", "too_small")
MAX_THUMBNAILS = 8
MAX_ATTEMPTS = 4 * MAX_THUMBNAILS
THUMBNAIL_SIDE = 160
CAPTION_HEIGHT = 28
COLUMNS = 4
SHEET_FILE = "quarantine_contact_sheet.png"


@dataclass(frozen=True)
class Thumbnail:
    key: str
    reason: str
    png: bytes  # at most THUMBNAIL_SIDE on each side

    def image(self) -> Image.Image:
        with Image.open(io.BytesIO(self.png)) as image:
            return image.convert("RGB")


def thumbnail_png(item: tuple[str, str], max_bytes: int, max_pixels: int, side: int = THUMBNAIL_SIDE) -> bytes | None:
    """PNG bytes of the file's thumbnail, or None when it may not or cannot be drawn. Runs in a pool worker."""
    path, sha256 = item
    try:
        data = read_limited(Path(path), max_bytes)
    except (Refused, OSError):
        return None
    if sha256_bytes(data) != sha256:  # changed since its verdict: not the file the quarantine describes
        return None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data)) as image:
                if image.width * image.height > max_pixels:
                    return None
                image.thumbnail((side, side))  # draft() for JPEG, reduce() otherwise: never the full size in memory
                small = image.convert("RGB")
    except Exception:  # noqa: BLE001 - a file that does not decode is simply not on the sheet
        return None
    buffer = io.BytesIO()
    small.save(buffer, "PNG")
    return buffer.getvalue()


def quarantine_thumbnails(
    raw: Path, quarantine: pd.DataFrame, *, max_bytes: int, max_pixels: int, timeout_s: float, workers: int = 1
) -> list[Thumbnail]:
    """Thumbnails of the first drawable rows of `quarantine` (key, sha256, reason), by key, from the raw root `raw`."""
    drawable = quarantine[quarantine["reason"].isin(DRAWABLE_REASONS) & quarantine["sha256"].notna()]
    items: dict[tuple[str, str], tuple[str, str]] = {}  # (path, sha256) -> (key, reason)
    for row in drawable.sort_values("key", kind="stable").head(MAX_ATTEMPTS).itertuples(index=False):
        try:
            items[(str(locate(raw, row.key)), row.sha256)] = (row.key, row.reason)
        except Refused:
            continue
    if not items:
        return []
    function = partial(thumbnail_png, max_bytes=max_bytes, max_pixels=max_pixels)
    drawn = []
    with IsolatedPool(
        function, workers=max(1, min(workers, len(items))), timeout_s=timeout_s, preload=[__name__]
    ) as pool:
        for item, png in pool.imap_unordered(items):
            if png is not None and not isinstance(png, WorkerLost):
                drawn.append(Thumbnail(*items[item], png))
    return sorted(drawn, key=lambda thumbnail: thumbnail.key)[:MAX_THUMBNAILS]


def contact_sheet_png(thumbnails: list[Thumbnail], columns: int = COLUMNS) -> bytes:
    """The full-size sheet: a grid of thumbnails, each with its reason and key printed under it."""
    cell_width, cell_height = THUMBNAIL_SIDE + 8, THUMBNAIL_SIDE + CAPTION_HEIGHT
    rows = max(1, -(-len(thumbnails) // columns))
    sheet = Image.new("RGB", (cell_width * min(columns, max(1, len(thumbnails))), cell_height * rows), "white")
    draw = ImageDraw.Draw(sheet)
    for index, thumbnail in enumerate(thumbnails):
        x, y = (index % columns) * cell_width + 4, (index // columns) * cell_height
        sheet.paste(thumbnail.image(), (x, y + 2))
        draw.text((x, y + THUMBNAIL_SIDE + 4), thumbnail.reason, fill=(200, 30, 30))
        draw.text((x, y + THUMBNAIL_SIDE + 15), _fit(thumbnail.key, 26), fill="black")
    buffer = io.BytesIO()
    sheet.save(buffer, "PNG", optimize=True)
    return buffer.getvalue()


def _fit(text: str, chars: int) -> str:
    text = "".join(char if char.isprintable() and char.isascii() else "?" for char in text)  # the default font is ASCII
    return text if len(text) <= chars else "..." + text[-(chars - 3) :]

"""Pictures as Markdown metadata entries that the Dagster UI draws in place.

The UI draws a Markdown entry inline only under 1000 characters, so a picture goes in as a data-URI
thumbnail at the largest width and best encoding that fits; the full-size picture is an output file.
"""

from __future__ import annotations

import base64
import io
import re
from collections.abc import Callable

from PIL import Image, features

INLINE_LIMIT = 1000  # characters; the UI's own threshold for drawing Markdown inline
WIDTHS = (200, 176, 160, 144, 128, 112, 96, 80, 64, 48, 32)  # the largest that fits wins
CAPTION_CHARS = 90
# Markdown punctuation that would end the alt text or the link, or start emphasis, a list or HTML.
_MARKDOWN_SPECIAL = re.compile(r"([\\`*_{}\[\]()#+\-.!|<>~])")

Picture = Image.Image | Callable[[int], Image.Image]  # an image, or one drawn for a given width


def _webp(method: int = 4, **options) -> Callable[[Image.Image], bytes]:
    def encode(image: Image.Image) -> bytes:
        buffer = io.BytesIO()
        image.save(buffer, "WEBP", method=method, **options)
        return buffer.getvalue()

    return encode


def _palette_png(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.convert("RGB").quantize(16).save(buffer, "PNG", optimize=True)
    return buffer.getvalue()


def _jpeg(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.convert("RGB").save(buffer, "JPEG", quality=45, optimize=True)
    return buffer.getvalue()


def encodings(image: Image.Image) -> list[tuple[str, Callable[[Image.Image], bytes]]]:
    """(MIME type, encoder), best first for this image: lossless WebP for drawings (few colours; slow
    and large on photos), lossy WebP for photos; without WebP in this Pillow, a palette PNG or a JPEG."""
    if not features.check("webp"):
        return [("image/png", _palette_png), ("image/jpeg", _jpeg)]
    lossy = [("image/webp", _webp(quality=quality)) for quality in (70, 45, 25)]
    drawing = image.getcolors(64) is not None
    # Lossless at method 6 (smallest, quick on a small drawing); lossy at 4 (6 is much slower for little).
    return [("image/webp", _webp(method=6, lossless=True, quality=100)), *lossy] if drawing else lossy


def markdown_text(text: str, max_chars: int = CAPTION_CHARS) -> str:
    """`text` safe inside Markdown alt text or a caption: one printable line, punctuation escaped, cut
    to `max_chars` (keys come from untrusted raw data)."""
    line = "".join(char if char.isprintable() else " " for char in text)
    if len(line) > max_chars:
        line = line[: max_chars - 1] + "…"
    return _MARKDOWN_SPECIAL.sub(r"\\\1", line)


def _scaled(image: Image.Image, width: int) -> Image.Image:
    """Within a `width` square, never enlarged."""
    copy = image.copy()
    copy.thumbnail((width, width), Image.Resampling.LANCZOS)
    return copy


def inline_picture(picture: Picture, alt: str, caption: str = "") -> str:
    """`![alt](data:...)` and the caption under it, shorter than INLINE_LIMIT characters in all. `picture` is an
    image (scaled down to fit) or a function drawing one for a width (redrawn small, lines stay one pixel)."""
    alt_text, caption_text = markdown_text(alt), markdown_text(caption)
    tail = f"\n\n{caption_text}" if caption_text else ""
    tried: set[tuple[int, int]] = set()
    for width in WIDTHS:
        image = picture(width) if callable(picture) else _scaled(picture, width)
        if image.size in tried:  # a small image is not enlarged: the same size again would not fit either
            continue
        tried.add(image.size)
        for mime, encode in encodings(image):
            text = f"![{alt_text}](data:{mime};base64,{base64.b64encode(encode(image)).decode()}){tail}"
            if len(text) < INLINE_LIMIT:
                return text
    raise ValueError(
        f"no thumbnail of {alt!r} fits a Markdown entry of {INLINE_LIMIT} characters, even {WIDTHS[-1]} pixels wide"
    )


def markdown_metadata(text: str) -> dict[str, str]:
    """The Pipes metadata value of a Markdown entry."""
    return {"raw_value": text, "type": "md"}

"""The per-image verdict: can these bytes be decoded safely into an upright picture we allow?

Runs in the isolated decode workers (`isolated_pool`), one file at a time. Every failure maps to one
reason code of `tables.REASONS`, with the exception text kept for the quarantine table. A JPEG gets a
strict libjpeg-turbo decode first (`corrupt_data`); anything it refuses otherwise goes through Pillow.
"""

from __future__ import annotations

import io
import re
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import NamedTuple

import numpy as np
from PIL import Image, ImageFile, ImageOps, UnidentifiedImageError

from . import jpeg_strict
from .hashing import sha256_bytes
from .perceptual_hash import hashes_of, hashes_of_pixels
from .raw_files import Refused, read_limited

DEFAULT_ALLOWED_FORMATS = ("JPEG", "PNG", "GIF", "WEBP", "BMP", "TIFF", "MPO")
# Checked before decoding (size from fstat, pixels from the header): past either, `too_large`.
# Pillow's own bomb guard (MAX_IMAGE_PIXELS, its warning made an error: `bomb`) still applies beneath.
DEFAULT_MAX_IMAGE_BYTES = 128 << 20
DEFAULT_MAX_PIXELS = 1_000_000_000
ORIENTATION_TAG = 0x0112
_ORIENTATIONS = frozenset(range(1, 9))
_SWAPS_SIDES = frozenset(range(5, 9))  # transpose, rotate 270, transverse, rotate 90
_TURNS = frozenset(range(2, 9))  # the tags exif_transpose acts on (it looks them up in a dict, so 6.0 acts too)
# Formats whose first frame is a plain JPEG stream, and the Pillow modes libjpeg-turbo decodes too.
_STRICT_FORMATS = frozenset({"JPEG", "MPO"})
_STRICT_MODES = frozenset({"L", "RGB", "CMYK"})
# Modes whose grey libjpeg-turbo gives directly, the grey the perceptual hash takes (CMYK goes via RGB).
_LUMA_MODES = frozenset({"L", "RGB"})

# Pillow tells corrupt from unsupported only in exception text; these patterns copy its own raises.
_BOMB = re.compile(r"decompressed data too large|too much memory used in text chunks", re.I)
_TRUNCATED = re.compile(r"truncated|incomplete checksum|unexpected end|premature end", re.I)
_CHECKSUM = re.compile(r"bad header checksum|crc", re.I)
_UNSUPPORTED = re.compile(
    r"cannot handle|unsupported|not supported|unknown pixel mode|unrecognized data stream contents"
    r"|decoder \S+ not available|unknown (raw )?mode",
    re.I,
)
_ADDRESS = re.compile(r" at 0x[0-9a-f]+")
# Pillow quotes file bytes in some messages ("broken PNG file (chunk b'...')"); the tables never do.
_BYTES_LITERAL = re.compile(r"\bb'(?:[^'\\]|\\.)*'" + r'|\bb"(?:[^"\\]|\\.)*"')
MAX_ERROR_CHARS = 300
# When two checks fail, report the most specific cause.
_PRIORITY = ("bomb", "truncated", "checksum", "unsupported", "unidentified", "decode_error")


class ImageVerdict(NamedTuple):
    """What the validation pass learned about one file; `reason` is None when the image is usable.
    A named tuple because one is pickled per image and rebuilt from the verdicts table."""

    sha256: str | None
    size: int
    reason: str | None = None
    stage: str = "decode"  # "read" (bytes) or "decode" (Pillow)
    error: str = ""
    format: str = ""
    mode: str = ""  # the decoder's original mode, before any conversion
    width: int = 0  # upright frame, after EXIF orientation
    height: int = 0
    orientation: int = 1  # the EXIF orientation exif_transpose applied (1 when absent or not 1..8)
    # perceptual_hash.Hashes of the upright picture (one per view), for a decoded image
    phash: tuple[int, ...] | None = None
    dhash: tuple[int, ...] | None = None

    @property
    def accepted(self) -> bool:
        return self.reason is None

    @classmethod
    def unread(cls, reason: str, error: str, stage: str = "read") -> ImageVerdict:
        """A verdict reached without the file's bytes: no hash, no size."""
        return cls(sha256=None, size=0, reason=reason, stage=stage, error=error)


def check_image_file(
    path: str | Path,
    allowed_formats: tuple[str, ...],
    min_side: int,
    max_bytes: int = DEFAULT_MAX_IMAGE_BYTES,
    max_pixels: int = DEFAULT_MAX_PIXELS,
    listed_etag: str | None = None,
) -> ImageVerdict:
    """Read `path` read-only and judge its bytes. A file that cannot or may not be read (past `max_bytes`,
    or not the `listed_etag` one: `raw_changed`) is a `read` verdict, never a crash."""
    try:
        data = read_limited(path, max_bytes, listed_etag)
    except Refused as refused:
        return ImageVerdict.unread(refused.reason, refused.detail)
    except OSError as error:
        # strerror, not the message: keeps the machine's raw-root path out, so tables match across hosts.
        text = f"{type(error).__name__}: {error.strerror or error}"
        return ImageVerdict.unread("unreadable", text)
    return check_image_bytes(data, allowed_formats, min_side, max_pixels)


@contextmanager
def _bomb_warning_is_an_error() -> Iterator[None]:
    """Pillow's DecompressionBombWarning raised as an error, so such a file is quarantined `bomb`, never
    decoded. A decorator of the steps where Pillow checks that limit."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        yield


@contextmanager
def _pixel_limit(limit: int | None) -> Iterator[None]:
    """Set Pillow's decompression-bomb limit (a module global) for the duration. Lifted only to read
    a header, so a size past --max-pixels is reported as `too_large`."""
    saved, Image.MAX_IMAGE_PIXELS = Image.MAX_IMAGE_PIXELS, limit
    try:
        yield
    finally:
        Image.MAX_IMAGE_PIXELS = saved


def check_image_bytes(
    data: bytes, allowed_formats: tuple[str, ...], min_side: int, max_pixels: int = DEFAULT_MAX_PIXELS
) -> ImageVerdict:
    digest = sha256_bytes(data)
    if not data:
        return ImageVerdict(sha256=digest, size=0, reason="empty", stage="read", error="the file has zero bytes")
    if ImageFile.LOAD_TRUNCATED_IMAGES:
        raise RuntimeError("PIL.ImageFile.LOAD_TRUNCATED_IMAGES is on; it would let truncated images through")

    def quarantine(reason: str, error: str) -> ImageVerdict:
        return ImageVerdict(sha256=digest, size=len(data), reason=reason, stage="decode", error=error)

    # Pass 0: the header alone, so a format not allowed or a size past the limit never reaches a decoder.
    try:
        with _pixel_limit(None), Image.open(io.BytesIO(data)) as image:
            header_format, (width, height) = image.format, image.size
            header = image
    except UnidentifiedImageError:
        return quarantine(*_diagnose_unidentified(data))
    except Exception:  # noqa: BLE001 - the passes below open it again and classify the error
        header_format = None
    if header_format is not None:
        if header_format not in allowed_formats:
            return quarantine("format_not_allowed", f"content is {header_format}; allowed: {','.join(allowed_formats)}")
        if width * height > max_pixels:
            return quarantine(
                "too_large",
                f"header says {width}x{height} = {width * height} pixels, above the limit of {max_pixels}; not decoded",
            )
        if header_format in _STRICT_FORMATS:
            verdict = _strict_jpeg(data, digest, min_side, quarantine, header)
            if verdict is not None:
                return verdict
    return _decode(data, digest, allowed_formats, min_side, quarantine)


def _strict_jpeg(data: bytes, digest: str, min_side: int, quarantine, header: Image.Image) -> ImageVerdict | None:
    """The JPEG pass: libjpeg-turbo decodes reduced, warnings as errors; `header` is Pillow's opened,
    unloaded image (mode, EXIF). None hands the file to Pillow's passes."""
    width, height = header.size
    if Image.MAX_IMAGE_PIXELS is not None and max(1, width) * max(1, height) > Image.MAX_IMAGE_PIXELS:
        return None  # Pillow's bomb check (lifted to read the header) would refuse it: its passes say `bomb`
    if header.mode not in _STRICT_MODES:
        return None
    try:
        small = jpeg_strict.decode_small(data, grey=header.mode in _LUMA_MODES)
    except jpeg_strict.CorruptData as error:
        return quarantine("corrupt_data", f"strict_decode(): {_describe(error)}")
    except ValueError:
        # A truncation, variant or header libjpeg-turbo refuses: Pillow's passes judge it.
        return None
    return _upright_verdict(header, digest, len(data), header.mode, min_side, header.format, header.size, small)


@_bomb_warning_is_an_error()
def _decode(data: bytes, digest: str, allowed_formats: tuple[str, ...], min_side: int, quarantine) -> ImageVerdict:
    # Pass 1: verify() (structure and CRCs, no pixel decoding).
    failures: list[tuple[str, str, str]] = []  # (step, reason, text)
    try:
        with Image.open(io.BytesIO(data)) as image:
            if image.format not in allowed_formats:
                return quarantine(
                    "format_not_allowed", f"content is {image.format}; allowed: {','.join(allowed_formats)}"
                )
            image.verify()
    except UnidentifiedImageError:
        return quarantine(*_diagnose_unidentified(data))
    except Exception as error:  # noqa: BLE001 - a fuzzed file can make Pillow raise anything; classify it
        failures.append(("verify", _classify(error), _describe(error)))
    # Pass 2: load() the first frame. It catches truncation verify() misses, and verify() catches bad
    # CRCs load() skips, so both always run.
    try:
        image = Image.open(io.BytesIO(data))
        original_mode = image.mode
        image.load()
    except Exception as error:  # noqa: BLE001 - see above
        failures.append(("load", _classify(error), _describe(error)))
    if failures:
        step, reason, text = min(failures, key=lambda failure: _PRIORITY.index(failure[1]))
        return quarantine(reason, f"{step}(): {text}")
    with image:
        return _upright_verdict(image, digest, len(data), original_mode, min_side, image.format, image.size)


def _upright_verdict(
    image: Image.Image,
    digest: str,
    size: int,
    original_mode: str,
    min_side: int,
    image_format: str,
    stored_size: tuple[int, int],
    small: np.ndarray | None = None,
) -> ImageVerdict:
    """Apply EXIF orientation as training will, then check the upright size (`stored_size`, sides swapped
    where the orientation turns it). `image` holds the EXIF, and the pixels unless `small` has them."""
    try:
        tag = image.getexif().get(ORIENTATION_TAG, 1)
        if small is None:
            # In place: a copy would duplicate every pixel; rewriting the EXIF is where broken EXIF fails.
            ImageOps.exif_transpose(image, in_place=True)
        elif tag in _TURNS:
            # The small picture with the file's metadata, so exif_transpose fails exactly as it would full-size.
            picture = Image.fromarray(small)
            picture.info = dict(image.info)
            ImageOps.exif_transpose(picture, in_place=True)
    except Exception as error:  # noqa: BLE001 - broken EXIF raises arbitrary types from Pillow's parser
        text = f"exif_transpose(): {_describe(error)}"
        return ImageVerdict(sha256=digest, size=size, reason="exif", stage="decode", error=text)
    # exif_transpose looks the tag up in a dict, so 6.0 (a rational) acts as 6 and 0 or 9 act as 1.
    orientation = int(tag) if tag in _ORIENTATIONS else 1
    width, height = stored_size[::-1] if orientation in _SWAPS_SIDES else stored_size
    hashes = hashes_of(image) if small is None else hashes_of_pixels(small, orientation)
    verdict = ImageVerdict(
        sha256=digest,
        size=size,
        format=image_format,
        mode=original_mode,
        width=width,
        height=height,
        orientation=orientation,
        phash=hashes.phash,
        dhash=hashes.dhash,
    )
    if width < min_side or height < min_side:
        return verdict._replace(
            reason="too_small", error=f"upright size {width}x{height} is under --min-side {min_side}"
        )
    return verdict


def _classify(error: BaseException) -> str:
    if isinstance(error, (Image.DecompressionBombError, Image.DecompressionBombWarning)) or _BOMB.search(str(error)):
        return "bomb"
    text = str(error)
    if _TRUNCATED.search(text):
        return "truncated"
    if _CHECKSUM.search(text):
        return "checksum"
    if _UNSUPPORTED.search(text):
        return "unsupported"
    return "decode_error"


@_bomb_warning_is_an_error()
def _diagnose_unidentified(data: bytes) -> tuple[str, str]:
    """Tell "not an image" apart from "a known format whose variant Pillow cannot open", by rerunning
    the plugins whose magic-byte check accepts the file (Image.open hides their complaints)."""
    Image.init()
    complaints = []
    for name, (factory, accept) in Image.OPEN.items():
        if accept is None or not accept(data[:16]):
            continue  # plugins without a magic check would claim any file
        try:
            factory(io.BytesIO(data), "")
        except Exception as plugin_error:  # noqa: BLE001 - we only want its message
            complaints.append(f"{name}: {_describe(plugin_error)}")
            # A KeyError under Pillow's SyntaxError is an unknown code in a plugin's table: a variant.
            if _UNSUPPORTED.search(str(plugin_error)) or isinstance(plugin_error.__cause__, KeyError):
                return "unsupported", f"looks like {name} but Pillow cannot open this variant: {complaints[-1]}"
    if complaints:
        return "unidentified", f"looks like {' / '.join(complaints)}; header unreadable"
    # Never the first bytes themselves: a text file could hold a secret, and the table is shared.
    return "unidentified", "not a recognised image format (no image plugin accepts its first bytes)"


def _describe(error: BaseException) -> str:
    # No object addresses, so the same file gives the same text (a reproducible data version); no
    # quoted file bytes; short and on one line.
    text = _BYTES_LITERAL.sub("<bytes>", _ADDRESS.sub("", f"{type(error).__name__}: {error}"))
    text = "".join(char if char.isprintable() else " " for char in text)
    return text if len(text) <= MAX_ERROR_CHARS else f"{text[:MAX_ERROR_CHARS]}..."

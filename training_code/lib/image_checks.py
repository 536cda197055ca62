"""The per-image verdict: can these bytes be decoded safely into an upright picture we allow?

Runs inside the isolated decode workers (`isolated_pool`), one file at a time. Every failure maps to
one reason code of `tables.REASONS`, with the exception text kept for the quarantine table.

A JPEG goes through a strict libjpeg-turbo decode, reduced (`jpeg_strict`): it catches the
mid-stream damage Pillow lets through (`corrupt_data`) and costs about half of Pillow's full-size
decode. What that decoder does not accept for any other reason (a truncation, a variant it cannot
decode, a hard error) goes through Pillow's passes exactly like every other format, so those
verdicts and their texts are Pillow's as before.
"""

from __future__ import annotations

import io
import re
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import wraps
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

import numpy as np
from PIL import Image, ImageFile, ImageOps, UnidentifiedImageError

from . import jpeg_strict
from .hashing import sha256_bytes
from .perceptual_hash import hashes_of, hashes_of_pixels
from .raw_files import Refused, read_limited

DEFAULT_ALLOWED_FORMATS = ("JPEG", "PNG", "GIF", "WEBP", "BMP", "TIFF", "MPO")
# The operator's limits, decided before a byte is decoded (file size from fstat, pixels from the
# header): past either, `too_large`. Beneath them Pillow's own decompression-bomb guard stays as it
# is (Image.MAX_IMAGE_PIXELS, 89.5 M pixels, its warning made an error: `bomb`), so a worker holds at
# most about max bytes + 4 x 89.5 M bytes of one image. Lower --max-pixels to be stricter than Pillow.
DEFAULT_MAX_IMAGE_BYTES = 128 << 20
DEFAULT_MAX_PIXELS = 1_000_000_000
ORIENTATION_TAG = 0x0112
_T = TypeVar("_T")
_ORIENTATIONS = frozenset(range(1, 9))
_SWAPS_SIDES = frozenset(range(5, 9))  # transpose, rotate 270, transverse, rotate 90
_TURNS = frozenset(range(2, 9))  # the tags exif_transpose acts on (it looks them up in a dict, so 6.0 acts too)
# The formats whose first frame is a plain JPEG stream, and the modes Pillow gives such a stream that
# libjpeg-turbo decodes too (L: grayscale, RGB: YCbCr or RGB, CMYK: CMYK or YCCK).
_STRICT_FORMATS = frozenset({"JPEG", "MPO"})
_STRICT_MODES = frozenset({"L", "RGB", "CMYK"})
# The modes whose grey libjpeg-turbo decodes itself (a grey stream, the Y of YCbCr, or BT.601 of an RGB
# stream), which is the grey the perceptual hash takes; a CMYK picture's goes through RGB.
_LUMA_MODES = frozenset({"L", "RGB"})

# Pillow reports problems through exception text only (SyntaxError and OSError cover both corrupt and
# unsupported files), so the message decides; each pattern below is copied from Pillow's own raises.
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

    A named tuple, a value: a pass makes one per image in its workers, pickles it back, and rebuilds
    the earlier ones from the verdicts table, which a frozen dataclass made three times as slow."""

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
    """Read `path` (read-only; located by `raw_files.locate`) and judge its bytes. A file that cannot
    or may not be read is a `read` verdict, never a crash, and a file past `max_bytes` is not read.
    `listed_etag`: see `raw_files.read_limited` (a file that is not the one listed: reason raw_changed)."""
    try:
        data = read_limited(path, max_bytes, listed_etag)
    except Refused as refused:
        return ImageVerdict.unread(refused.reason, refused.detail)
    except OSError as error:
        # strerror, not the message: the key column names the file, and the text stays free of the
        # machine's raw-root path so the table is the same wherever the job ran.
        text = f"{type(error).__name__}: {error.strerror or error}"
        return ImageVerdict.unread("unreadable", text)
    return check_image_bytes(data, allowed_formats, min_side, max_pixels)


def check_image_bytes(
    data: bytes, allowed_formats: tuple[str, ...], min_side: int, max_pixels: int = DEFAULT_MAX_PIXELS
) -> ImageVerdict:
    digest = sha256_bytes(data)
    if not data:
        return ImageVerdict(sha256=digest, size=0, reason="empty", stage="read", error="the file has zero bytes")
    if ImageFile.LOAD_TRUNCATED_IMAGES:
        raise RuntimeError("PIL.ImageFile.LOAD_TRUNCATED_IMAGES is on; it would let truncated images through")
    return _judge(data, digest, allowed_formats, min_side, max_pixels)


def _bomb_warning_is_an_error(function: Callable[..., _T]) -> Callable[..., _T]:
    """Run `function` with Pillow's DecompressionBombWarning (a picture past MAX_IMAGE_PIXELS, short of
    twice that) raised as an error, so such a file is quarantined `bomb`, never decoded. For the steps
    where Pillow checks that limit: its passes and the plugins `_diagnose_unidentified` reruns. The
    header is read with no limit and the strict JPEG pass decodes in libjpeg-turbo, so the common path
    skips this: setting the filter up and back costs ~10 us, about 3% of a small JPEG's verdict."""

    @wraps(function)
    def with_bomb_errors(*args: Any, **kwargs: Any) -> _T:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            return function(*args, **kwargs)

    return with_bomb_errors


@contextmanager
def _pixel_limit(limit: int | None) -> Iterator[None]:
    """Pillow's decompression-bomb limit for the duration (a module global: one decode per worker).
    Lifted only to read a header, so a size past --max-pixels is reported as such."""
    saved, Image.MAX_IMAGE_PIXELS = Image.MAX_IMAGE_PIXELS, limit
    try:
        yield
    finally:
        Image.MAX_IMAGE_PIXELS = saved


def _judge(data: bytes, digest: str, allowed_formats: tuple[str, ...], min_side: int, max_pixels: int) -> ImageVerdict:
    def quarantine(reason: str, error: str) -> ImageVerdict:
        return ImageVerdict(sha256=digest, size=len(data), reason=reason, stage="decode", error=error)

    # Pass 0: the header alone (Image.open decodes no pixels). The content decides the format, and a
    # format we do not allow, or a size past the limit, is never handed to a decoder.
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
    """The JPEG pass: Pillow has read the header (`header`: mode, EXIF; opened once, its pixels never
    loaded), libjpeg-turbo decodes the pixels reduced with warnings as errors. None hands the
    file to Pillow's passes."""
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
        # Not a corrupt-data warning: a truncation ("Premature end of JPEG file"), a variant or marker
        # libjpeg-turbo refuses, a header it cannot parse. Pillow's passes judge it as any other file.
        return None

    return _upright_verdict(
        header,
        digest,
        len(data),
        original_mode=header.mode,
        min_side=min_side,
        image_format=header.format,
        stored_size=header.size,
        small=small,
    )


@_bomb_warning_is_an_error
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
    # Pass 2: a full load() of the first frame on a freshly opened file; it catches truncation that
    # verify() misses, and verify() catches bad CRCs that load() skips, so both always run.
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
    """Apply EXIF orientation exactly as training will read the image, then check the upright size
    (the stored frame's, `stored_size`, with its sides swapped where the orientation turns it).

    `image` holds the EXIF, and the pixels unless `small` (a JPEG's reduced strict decode) has them."""
    try:
        tag = image.getexif().get(ORIENTATION_TAG, 1)
        if small is None:
            # In place: for the common orientation 1 it does nothing, where a copy would duplicate every
            # decoded pixel; it still rewrites the EXIF of a rotated image, which is where broken EXIF fails.
            ImageOps.exif_transpose(image, in_place=True)
        elif tag in _TURNS:
            # The small picture carrying the file's own metadata: the same exif_transpose, on the same
            # EXIF and XMP, as a full-size decode, for a fraction of the pixels. Any other tag only reads
            # the EXIF, done above.
            picture = Image.fromarray(small)
            picture.info = dict(image.info)
            ImageOps.exif_transpose(picture, in_place=True)
    except Exception as error:  # noqa: BLE001 - broken EXIF raises arbitrary types from Pillow's parser
        text = f"exif_transpose(): {_describe(error)}"
        return ImageVerdict(sha256=digest, size=size, reason="exif", stage="decode", error=text)
    # exif_transpose looks the tag up in a dict, so 6.0 (a rational) acts as 6 and 0 or 9 act as 1.
    orientation = int(tag) if tag in _ORIENTATIONS else 1
    width, height = stored_size[::-1] if orientation in _SWAPS_SIDES else stored_size
    # From the picture decoded above (upright already, or the small JPEG decode and its orientation).
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


@_bomb_warning_is_an_error
def _diagnose_unidentified(data: bytes) -> tuple[str, str]:
    """Tell "not an image" apart from "a known format whose variant Pillow cannot open".

    Image.open hides each plugin's own complaint behind "cannot identify image file"; rerun the
    plugins whose magic-byte check accepts this file to recover it (a 12-bit JPEG says
    "cannot handle 12-bit layers", a TIFF with an unknown compression names the code).
    """
    Image.init()
    complaints = []
    for name, (factory, accept) in Image.OPEN.items():
        if accept is None or not accept(data[:16]):
            continue  # plugins without a magic check would claim any file
        try:
            factory(io.BytesIO(data), "")
        except Exception as plugin_error:  # noqa: BLE001 - we only want its message
            complaints.append(f"{name}: {_describe(plugin_error)}")
            # Pillow wraps a KeyError from the plugin's lookup tables (an unknown TIFF compression or
            # photometric code) in a SyntaxError: a variant it does not implement.
            if _UNSUPPORTED.search(str(plugin_error)) or isinstance(plugin_error.__cause__, KeyError):
                return "unsupported", f"looks like {name} but Pillow cannot open this variant: {complaints[-1]}"
    if complaints:
        return "unidentified", f"looks like {' / '.join(complaints)}; header unreadable"
    # Never the first bytes themselves: a text file could hold a secret, and the table is shared.
    return "unidentified", "not a recognised image format (no image plugin accepts its first bytes)"


def _describe(error: BaseException) -> str:
    # Without object addresses ("<_io.BytesIO object at 0x7f...>") the same file gives the same text,
    # so the quarantine table, and with it the data version, is reproducible. Quoted file bytes are
    # cut out, and the text kept short and on one line.
    text = _BYTES_LITERAL.sub("<bytes>", _ADDRESS.sub("", f"{type(error).__name__}: {error}"))
    text = "".join(char if char.isprintable() else " " for char in text)
    return text if len(text) <= MAX_ERROR_CHARS else f"{text[:MAX_ERROR_CHARS]}..."

"""Per-image verdicts on real bad and awkward files, and the isolated pool's timeout and crash handling."""

from __future__ import annotations

import io
import os
import signal
import struct
import time
import zlib
from functools import partial
from pathlib import Path

import pytest
from PIL import Image, ImageDraw

from training_code.lib.image_checks import DEFAULT_ALLOWED_FORMATS, check_image_file
from training_code.lib.isolated_pool import IsolatedPool, TaskRaised, WorkerLost
from training_code.lib.shard_format import decode_upright

ALLOWED = DEFAULT_ALLOWED_FORMATS


def encode(image: Image.Image, fmt: str, **options) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, fmt, **options)
    return buffer.getvalue()


def scene(mode: str = "RGB", size: tuple[int, int] = (96, 64)) -> Image.Image:
    """A picture with structure, so compressed streams are long enough to cut in the middle."""
    image = Image.new("RGB", size, (40, 90, 160))
    draw = ImageDraw.Draw(image)
    for k in range(0, size[0], 6):
        draw.line((k, 0, size[0] - k, size[1]), fill=(k * 2 % 256, 200, 30), width=2)
    return image.convert(mode)


def png_chunk(kind: bytes, payload: bytes) -> bytes:
    return struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", zlib.crc32(kind + payload))


def png_declaring(width: int, height: int) -> bytes:
    """A tiny 1-bit PNG whose header claims width x height: a real decompression bomb shape."""
    header = png_chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0))
    return (
        b"\x89PNG\r\n\x1a\n"
        + header
        + png_chunk(b"IDAT", zlib.compress(b"\x00" * (width // 8 + 1)))
        + png_chunk(b"IEND", b"")
    )


def png_with_flipped_crc(png: bytes) -> bytes:
    crc_at = png.index(b"IDAT") + 4 + int.from_bytes(png[png.index(b"IDAT") - 4 : png.index(b"IDAT")], "big")
    return png[:crc_at] + bytes([png[crc_at] ^ 0xFF]) + png[crc_at + 1 :]


def png_with_huge_text(png: bytes) -> bytes:
    """A zTXt chunk that inflates past Pillow's text limit (1 MB): a memory bomb in metadata."""
    text = png_chunk(b"zTXt", b"comment\x00\x00" + zlib.compress(b"A" * (4 << 20), 9))
    return png[:33] + text + png[33:]  # right after IHDR


def jpeg_12_bit() -> bytes:
    """A JPEG whose frame header says 12-bit samples (valid JPEG, which Pillow cannot decode)."""
    data = bytearray(encode(scene(), "JPEG"))
    data[data.index(b"\xff\xc0") + 4] = 12
    return bytes(data)


def jpeg_damaged_mid_stream() -> bytes:
    """Three bytes of the entropy-coded data inverted: libjpeg warns "Corrupt JPEG data", Pillow
    decodes garbage blocks without a word (tests/jobs/test_corrupt_jpeg.py does this to whole photos)."""
    data = bytearray(encode(scene(), "JPEG"))
    sos = data.index(b"\xff\xda")
    start = sos + 2 + int.from_bytes(data[sos + 2 : sos + 4], "big")
    for fraction in (0.25, 0.5, 0.75):
        data[start + int((len(data) - 2 - start) * fraction)] ^= 0xFF
    with Image.open(io.BytesIO(bytes(data))) as image:
        image.load()  # the case is only worth having while Pillow takes it for a good image
    return bytes(data)


def tiff_with_compression(code: int) -> bytes:
    data = bytearray(encode(scene(), "TIFF", compression="raw"))
    entry = data.index(b"\x03\x01\x03\x00\x01\x00\x00\x00")  # little-endian tag 259 (Compression), SHORT, count 1
    data[entry + 8 : entry + 10] = code.to_bytes(2, "little")
    return bytes(data)


def jpeg_with_exif_ifd(entries: list[tuple[int, int, int, bytes]]) -> bytes:
    """A JPEG with a hand-built big-endian EXIF IFD; entries are (tag, type, count, 4-byte value)."""
    ifd = b"MM\x00\x2a" + struct.pack(">IH", 8, len(entries))
    ifd += b"".join(struct.pack(">HHI", tag, kind, count) + value for tag, kind, count, value in entries) + b"\x00" * 4
    app1 = b"Exif\x00\x00" + ifd
    jpeg = encode(scene(), "JPEG")
    return jpeg[:2] + b"\xff\xe1" + struct.pack(">H", len(app1) + 2) + app1 + jpeg[2:]


def rotated_jpeg(orientation: int) -> bytes:
    exif = Image.Exif()
    exif[0x0112] = orientation
    return encode(scene(size=(80, 50)), "JPEG", exif=exif.tobytes())


def single_frame_gif() -> bytes:
    return encode(scene().convert("P", palette=Image.Palette.ADAPTIVE), "GIF")


def multi_frame_gif() -> bytes:
    frames = [scene(size=(70, 40)).rotate(angle).convert("P") for angle in (0, 90, 180)]
    return encode(frames[0], "GIF", save_all=True, append_images=frames[1:])


def tiff_with_photometric(code: int) -> bytes:
    """A TIFF whose PhotometricInterpretation is one Pillow does not implement (e.g. 32844, LogL)."""
    data = bytearray(encode(scene(), "TIFF", compression="raw"))
    entry = data.index(b"\x06\x01\x03\x00\x01\x00\x00\x00")  # tag 262 (Photometric), SHORT, count 1
    data[entry + 8 : entry + 10] = code.to_bytes(2, "little")
    return bytes(data)


FIRST, SECOND = (200, 30, 30), (30, 200, 30)


def two_frames(fmt: str) -> bytes:
    """A multi-frame file whose first frame is red and the second green (MPO, APNG, GIF)."""
    frames = [Image.new("RGB", (60, 40), FIRST), Image.new("RGB", (60, 40), SECOND)]
    return encode(frames[0], fmt, save_all=True, append_images=frames[1:])


def judge(tmp_path: Path, name: str, data: bytes, allowed=ALLOWED, min_side: int = 8):
    path = tmp_path / name
    path.write_bytes(data)
    return check_image_file(path, allowed, min_side)


BAD_CASES = {
    "zero_byte.jpg": (lambda: b"", "empty", "read"),
    "html_page.jpg": (lambda: b"<html><body>404 Not Found</body></html>\n", "unidentified", "decode"),
    "truncated.jpg": (lambda: encode(scene(), "JPEG")[:-400], "truncated", "decode"),
    "truncated.png": (lambda: encode(scene(), "PNG")[:-300], "truncated", "decode"),
    "truncated.gif": (lambda: single_frame_gif()[:-200], "truncated", "decode"),
    "damaged_mid_stream.jpg": (jpeg_damaged_mid_stream, "corrupt_data", "decode"),
    "bad_crc.png": (lambda: png_with_flipped_crc(encode(scene(), "PNG")), "checksum", "decode"),
    "bomb_error.png": (lambda: png_declaring(20_000, 20_000), "bomb", "decode"),  # > 2x MAX_IMAGE_PIXELS
    "bomb_warning.png": (lambda: png_declaring(12_000, 12_000), "bomb", "decode"),  # between 1x and 2x
    "claims_100k.png": (
        lambda: png_declaring(100_000, 100_000),
        "too_large",
        "decode",
    ),  # past --max-pixels, from the header
    "huge_text.png": (lambda: png_with_huge_text(encode(scene(), "PNG")), "bomb", "decode"),
    "twelve_bit.jpg": (jpeg_12_bit, "unsupported", "decode"),
    "jpeg2000_in.tif": (lambda: tiff_with_compression(34712), "unsupported", "decode"),
    "logl_photometric.tif": (lambda: tiff_with_photometric(32844), "unsupported", "decode"),
    "tiny.png": (lambda: encode(Image.new("RGB", (1, 1)), "PNG"), "too_small", "decode"),
    "icon.ico": (lambda: encode(scene(), "ICO"), "format_not_allowed", "decode"),
    # A float-typed tag next to orientation 6: exif_transpose fails re-writing the EXIF.
    "broken_exif.jpg": (
        lambda: jpeg_with_exif_ifd([(0x0112, 3, 1, struct.pack(">HH", 6, 0)), (0x0132, 11, 1, b"\x7f\xc0\x00\x00")]),
        "exif",
        "decode",
    ),
}


@pytest.mark.parametrize("name", sorted(BAD_CASES))
def test_bad_file_gets_its_reason(tmp_path, name):
    make, reason, stage = BAD_CASES[name]
    verdict = judge(tmp_path, name, make())
    assert (verdict.reason, verdict.stage) == (reason, stage), verdict.error
    assert verdict.sha256 and len(verdict.sha256) == 64
    assert verdict.error


def test_checksum_is_caught_by_verify_and_truncation_by_load(tmp_path):
    assert judge(tmp_path, "crc.png", png_with_flipped_crc(encode(scene(), "PNG"))).error.startswith("verify()")
    assert judge(tmp_path, "cut.jpg", encode(scene(), "JPEG")[:-400]).error.startswith("load()")


def test_limits_are_decided_before_reading_or_decoding(tmp_path):
    path = tmp_path / "big.jpg"
    path.write_bytes(encode(scene(), "JPEG"))
    verdict = check_image_file(path, ALLOWED, 8, max_bytes=100)
    assert (verdict.reason, verdict.stage, verdict.sha256) == ("too_large", "read", None), (
        "refused from fstat, not read"
    )
    # A lower --max-pixels takes over from Pillow's own bomb limit, and names the size.
    path = tmp_path / "wide.png"
    path.write_bytes(png_declaring(12_000, 12_000))
    verdict = check_image_file(path, ALLOWED, 8, max_pixels=10_000_000)
    assert verdict.reason == "too_large" and "12000x12000" in verdict.error
    fifo = tmp_path / "pipe.jpg"
    os.mkfifo(fifo)
    assert check_image_file(fifo, ALLOWED, 8).reason == "unreadable", "a FIFO is neither opened blocking nor read"


def test_no_message_quotes_the_files_bytes(tmp_path):
    secret = b"aws_secret_access_key = hostile-secret-value\n"
    verdict = judge(tmp_path, "notes.jpg", secret)
    assert (
        verdict.reason == "unidentified"
        and b"hostile" not in verdict.error.encode()
        and "aws_secret" not in verdict.error
    )
    # Pillow quotes chunk names and other bytes in some messages; they are cut out of the table.
    broken = encode(scene(), "PNG")
    broken = broken[:37] + b"hostile-" + broken[45:]  # the IDAT name and what follows, overwritten
    verdict = judge(tmp_path, "broken.png", broken)
    assert verdict.reason is not None and "hostile" not in verdict.error and "b'" not in verdict.error, verdict.error


def test_unreadable_file_has_no_sha256(tmp_path):
    verdict = check_image_file(tmp_path / "vanished.jpg", ALLOWED, 8)
    assert (verdict.reason, verdict.stage, verdict.sha256) == ("unreadable", "read", None)
    assert verdict.error == "FileNotFoundError: No such file or directory"


GOOD_CASES = {
    "cmyk.jpg": (lambda: encode(scene("CMYK"), "JPEG"), "JPEG", "CMYK", (96, 64)),
    "sixteen_bit.png": (lambda: encode(scene("L").convert("I;16"), "PNG"), "PNG", "I;16", (96, 64)),
    "palette_transparent.png": (lambda: encode(scene("P"), "PNG", transparency=0), "PNG", "P", (96, 64)),
    "alpha.png": (lambda: encode(scene("RGBA"), "PNG"), "PNG", "RGBA", (96, 64)),
    "animated.gif": (multi_frame_gif, "GIF", "P", (70, 40)),
    "png_named_as.jpg": (lambda: encode(scene(), "PNG"), "PNG", "RGB", (96, 64)),  # content decides
    "webp.webp": (lambda: encode(scene(), "WEBP"), "WEBP", "RGB", (96, 64)),
    "two_frames.mpo": (lambda: two_frames("MPO"), "MPO", "RGB", (60, 40)),
    "two_frames.apng": (lambda: two_frames("PNG"), "PNG", "RGB", (60, 40)),
    "float.tif": (lambda: encode(scene("F"), "TIFF"), "TIFF", "F", (96, 64)),
}


@pytest.mark.parametrize("fmt", ["MPO", "PNG", "GIF"])
def test_multi_frame_file_is_read_as_its_first_frame(tmp_path, fmt):
    data = two_frames(fmt)
    with Image.open(io.BytesIO(data)) as image:
        assert getattr(image, "n_frames", 1) == 2, "the file must really hold two frames"
    assert judge(tmp_path, f"f.{fmt.lower()}", data).accepted
    assert decode_upright(data).getpixel((30, 20)) == pytest.approx(FIRST, abs=8)


@pytest.mark.parametrize("name", sorted(GOOD_CASES))
def test_awkward_but_valid_file_is_accepted_with_its_original_mode(tmp_path, name):
    make, fmt, mode, size = GOOD_CASES[name]
    verdict = judge(tmp_path, name, make())
    assert verdict.accepted, verdict.error
    assert (verdict.format, verdict.mode, (verdict.width, verdict.height), verdict.orientation) == (fmt, mode, size, 1)


@pytest.mark.parametrize("orientation, upright", [(1, (80, 50)), (3, (80, 50)), (6, (50, 80)), (8, (50, 80))])
def test_exif_orientation_is_recorded_and_size_is_upright(tmp_path, orientation, upright):
    verdict = judge(tmp_path, f"rotated_{orientation}.jpg", rotated_jpeg(orientation))
    assert verdict.accepted, verdict.error
    assert (verdict.orientation, (verdict.width, verdict.height)) == (orientation, upright)


def test_format_allow_list_goes_by_content_not_extension(tmp_path):
    png_bytes = encode(scene(), "PNG")
    assert judge(tmp_path, "a.png", png_bytes, allowed=("JPEG",)).reason == "format_not_allowed"
    assert judge(tmp_path, "b.jpg", png_bytes, allowed=("PNG",)).accepted


def test_raw_file_is_opened_read_only_and_left_unchanged(tmp_path):
    path = tmp_path / "locked.jpg"
    path.write_bytes(rotated_jpeg(6))
    path.chmod(0o444)
    before = (path.read_bytes(), path.stat().st_mtime_ns)
    assert check_image_file(path, ALLOWED, 8).accepted
    assert (path.read_bytes(), path.stat().st_mtime_ns) == before


# Worker functions for the pool tests: module level so the worker processes can unpickle them.
def misbehave(item: str) -> str:
    if item == "hang":
        time.sleep(600)
    if item == "segfault":
        os.kill(os.getpid(), signal.SIGSEGV)
    if item == "exit":
        os._exit(3)
    if item == "bug":
        raise ValueError("a bug in the check itself")
    if item == "oom":
        raise MemoryError()
    return item.upper()


def check_that_hangs_or_crashes(path: str, allowed_formats, min_side, **limits):
    """The real check, except that files named hang* hang, segfault* crash the worker and oom* run it
    out of memory (used by the job test)."""
    name = Path(path).name
    if name.startswith("hang"):
        time.sleep(600)
    if name.startswith("segfault"):
        os.kill(os.getpid(), signal.SIGSEGV)
    if name.startswith("oom"):
        raise MemoryError()
    return check_image_file(path, allowed_formats, min_side, **limits)


def test_pool_survives_a_hang_and_crashes_and_keeps_going():
    items = ["a", "hang", "b", "segfault", "c", "exit", "d", "oom", "e"]
    started = time.monotonic()
    with IsolatedPool(misbehave, workers=2, timeout_s=1.0) as pool:
        results = dict(pool.imap_unordered(items))
        assert pool.replaced == 4
    assert time.monotonic() - started < 15
    assert {k: results[k] for k in "abcde"} == {k: k.upper() for k in "abcde"}
    assert results["hang"] == WorkerLost("timeout", "no result within 1 s; worker killed")
    assert results["segfault"] == WorkerLost("crash", "worker killed by SIGSEGV")
    assert results["exit"] == WorkerLost("crash", "worker exited with code 3")
    assert results["oom"].reason == "too_large", "a MemoryError costs its item one verdict, not the pass"


def test_pool_fails_loudly_on_a_bug_in_the_function():
    with pytest.raises(TaskRaised, match=r"(?s)'bug'.*ValueError: a bug in the check itself"):
        with IsolatedPool(misbehave, workers=1, timeout_s=5.0) as pool:
            list(pool.imap_unordered(["a", "bug", "b"]))


def test_pool_overhead_is_small_next_to_decoding(tmp_path):
    paths = []
    for n in range(60):
        paths.append(tmp_path / f"{n}.jpg")
        paths[-1].write_bytes(encode(scene(size=(320, 240)).rotate(n), "JPEG"))
    check = partial(check_image_file, allowed_formats=ALLOWED, min_side=8)
    started = time.perf_counter()
    direct = {str(p): check(p) for p in paths}
    in_process_s = time.perf_counter() - started
    with IsolatedPool(check, workers=1, timeout_s=20, preload=["training_code.lib.image_checks"]) as pool:
        pool.wait_ready()
        started = time.perf_counter()
        pooled = dict(pool.imap_unordered([str(p) for p in paths]))
        pooled_s = time.perf_counter() - started
    assert pooled == direct
    # One worker does the same work plus a pipe round trip per file; allow generous noise for shared CI.
    assert pooled_s < 3 * in_process_s + 0.5, (pooled_s, in_process_s)

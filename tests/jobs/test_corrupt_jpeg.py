"""JPEGs damaged mid-stream: Pillow decodes them to garbage without a word; the validation pass
quarantines them as `corrupt_data` through libjpeg-turbo with warnings as errors.

This machine holds no real photographs (only icons, diagrams and the project's own synthetic
scenes), so the photos are the most photo-like images at hand: `benchmarks.images.photo_jpeg`,
smooth structure plus sensor-like noise that compresses like a camera frame, in the JPEG variants
cameras and tools write (4:2:0, 4:4:4, progressive, grayscale, CMYK). Each is damaged as in the
issue: three bytes flipped after the start of scan. Only the copies libjpeg-turbo itself rejects
when its warnings are errors (what `jpeginfo -c` reports) are kept. Most of those it rejects for a
corrupt-data warning, which Pillow swallows; a few for a hard error (a flipped byte that reads as an
unknown marker), which Pillow reports too ("broken data stream") and which keeps Pillow's verdict.
"""

from __future__ import annotations

import io
import json
import random
import re
from importlib.metadata import version

import pandas as pd
import pytest
import simplejpeg
from PIL import Image
from test_validate_job import build_index

from benchmarks.images import photo_jpeg
from training_code.lib import jpeg_strict
from training_code.lib.image_checks import DEFAULT_ALLOWED_FORMATS, check_image_file
from training_code.lib.validation_pass import validate
from training_code.validate import get_args_parser
from zero_assets.backends.sagemaker.code_package import build_code_package

DAMAGED_PER_PHOTO = 12


def reencode(jpeg: bytes, mode: str, **options) -> bytes:
    buffer = io.BytesIO()
    Image.open(io.BytesIO(jpeg)).convert(mode).save(buffer, "JPEG", quality=90, **options)
    return buffer.getvalue()


def photos() -> dict[str, bytes]:
    base = photo_jpeg(seed=11, megapixels=0.3)
    return {
        "420.jpg": base,
        "444.jpg": reencode(photo_jpeg(seed=12, megapixels=0.2), "RGB", subsampling=0),
        "progressive.jpg": reencode(photo_jpeg(seed=13, megapixels=0.2), "RGB", progressive=True),
        "gray.jpg": reencode(photo_jpeg(seed=14, megapixels=0.2), "L"),
        "cmyk.jpg": reencode(photo_jpeg(seed=15, megapixels=0.1), "CMYK"),
    }


def flip_three_bytes_after_sos(jpeg: bytes, rng: random.Random) -> bytes:
    """Invert three bytes of the entropy-coded data (after the first SOS segment, before EOI)."""
    sos = jpeg.index(b"\xff\xda")
    start = sos + 2 + int.from_bytes(jpeg[sos + 2 : sos + 4], "big")
    damaged = bytearray(jpeg)
    for position in rng.sample(range(start, len(jpeg) - 2), 3):
        damaged[position] ^= 0xFF
    return bytes(damaged)


def libjpeg_turbo_rejects(jpeg: bytes) -> bool:
    """libjpeg-turbo's own verdict, at full size, with its warnings as errors."""
    try:
        simplejpeg.decode_jpeg(jpeg, strict=True)
    except ValueError:
        return True
    return False


def pillow_accepts(jpeg: bytes) -> bool:
    try:
        with Image.open(io.BytesIO(jpeg)) as image:
            image.verify()
        with Image.open(io.BytesIO(jpeg)) as image:
            image.load()
    except Exception:  # noqa: BLE001 - any refusal counts
        return False
    return True


@pytest.fixture(scope="module")
def damaged() -> dict[str, bytes]:
    """name -> bytes of every damaged copy libjpeg-turbo rejects with warnings as errors."""
    rng = random.Random(14)
    kept = {}
    for name, jpeg in photos().items():
        for n in range(DAMAGED_PER_PHOTO):
            copy = flip_three_bytes_after_sos(jpeg, rng)
            if libjpeg_turbo_rejects(copy):
                kept[f"{name.removesuffix('.jpg')}_damaged_{n}.jpg"] = copy
    return kept


def test_the_damage_is_what_pillow_misses(damaged):
    # Enough damaged copies of every variant that the verdicts below mean something ...
    for variant in ("420", "444", "progressive", "gray", "cmyk"):
        assert sum(name.startswith(f"{variant}_") for name in damaged) >= 3, variant
    # ... and Pillow's verify() + load() takes nearly all of them for good images.
    missed = sum(pillow_accepts(jpeg) for jpeg in damaged.values())
    assert missed >= 0.8 * len(damaged), f"Pillow accepts {missed} of {len(damaged)}"


def test_every_damaged_photo_is_quarantined_as_corrupt_data_and_every_original_accepted(tmp_path, damaged):
    for name, jpeg in damaged.items():
        (tmp_path / name).write_bytes(jpeg)
        verdict = check_image_file(tmp_path / name, DEFAULT_ALLOWED_FORMATS, 8)
        assert verdict.stage == "decode" and verdict.sha256 and len(verdict.sha256) == 64
        if pillow_accepts(jpeg):  # what Pillow misses
            assert verdict.reason == "corrupt_data", (name, verdict.error)
            assert verdict.error.startswith("strict_decode(): ") and "Corrupt JPEG data" in verdict.error, verdict.error
        else:  # a hard error both decoders report: Pillow's verdict, as for every file libjpeg-turbo refuses
            assert (verdict.reason, verdict.error) == (
                "decode_error",
                "load(): OSError: broken data stream when reading image file",
            ), name
    for name, jpeg in photos().items():
        (tmp_path / name).write_bytes(jpeg)
        verdict = check_image_file(tmp_path / name, DEFAULT_ALLOWED_FORMATS, 8)
        with Image.open(io.BytesIO(jpeg)) as image:
            expected = ("JPEG", image.mode, image.size)
        assert verdict.accepted, (name, verdict.error)
        assert (verdict.format, verdict.mode, (verdict.width, verdict.height)) == expected, name


def test_reduced_scale_decode_gives_the_full_size_verdict(damaged):
    """The reduced decode still entropy-decodes every block: on every damaged copy, kept or not, it
    warns exactly when the full-size decode does."""
    rng = random.Random(15)
    for jpeg in photos().values():
        with Image.open(io.BytesIO(jpeg)) as image:
            # libjpeg-turbo's smallest factor (1/8 to 1/1) that leaves each side MIN_SIDE pixels or more
            factor = next(f for f in (8, 4, 2, 1) if min(image.size) / f >= jpeg_strict.MIN_SIDE or f == 1)
            reduced = (-(-image.height // factor), -(-image.width // factor))
        assert jpeg_strict.decode_small(jpeg).shape[:2] == reduced, "decoded reduced"
        assert jpeg_strict.decode_small(jpeg, grey=True).shape == reduced, "its luma alone, reduced"
        for _ in range(DAMAGED_PER_PHOTO):
            copy = flip_three_bytes_after_sos(jpeg, rng)
            try:
                simplejpeg.decode_jpeg(copy, strict=True)
                full = None
            except ValueError as error:
                full = str(error)
            for grey in (False, True):  # the luma alone entropy-decodes the chroma all the same
                try:
                    jpeg_strict.decode_small(copy, grey=grey)
                    small = None
                except ValueError as error:  # a hard error, as it is
                    small = str(error)
                except jpeg_strict.CorruptData as error:
                    small = str(error)
                assert small == full, f"grey={grey}"


def test_a_rotated_photo_is_upright_through_the_strict_path(tmp_path):
    exif = Image.Exif()
    exif[0x0112] = 6
    buffer = io.BytesIO()
    Image.open(io.BytesIO(photo_jpeg(seed=16, megapixels=0.1))).save(buffer, "JPEG", exif=exif.tobytes())
    (tmp_path / "rotated.jpg").write_bytes(buffer.getvalue())
    with Image.open(io.BytesIO(buffer.getvalue())) as image:
        width, height = image.size
    verdict = check_image_file(tmp_path / "rotated.jpg", DEFAULT_ALLOWED_FORMATS, 8)
    assert verdict.accepted and (verdict.orientation, verdict.width, verdict.height) == (6, height, width)


def test_the_validation_job_quarantines_them_with_their_meaning(tmp_path, damaged):
    """The job end to end (isolated decode workers, the quarantine table's schema, the report)."""
    raw = tmp_path / "raw" / "cam"
    raw.mkdir(parents=True)
    coco = {"images": [], "annotations": [], "categories": [{"id": 1, "name": "part"}]}
    missed = {name: jpeg for name, jpeg in sorted(damaged.items()) if pillow_accepts(jpeg)}
    chosen = dict(list(missed.items())[::4]) | {f"intact_{name}": jpeg for name, jpeg in photos().items()}
    for n, (name, jpeg) in enumerate(sorted(chosen.items()), start=1):
        (raw / name).write_bytes(jpeg)
        coco["images"].append({"id": n, "file_name": name})
    (raw / "annotations.json").write_text(json.dumps(coco))
    build_index(tmp_path / "raw", tmp_path / "index")
    args = get_args_parser().parse_args(
        [
            "--index",
            str(tmp_path / "index"),
            "--raw",
            str(tmp_path / "raw"),
            "--out",
            str(tmp_path / "out"),
            "--workers",
            "2",
            "--max-quarantine-rate",
            "1",
        ]
    )
    manifest = validate(args)[0]
    quarantine = pd.read_parquet(tmp_path / "out" / "quarantine.parquet")
    accepted = pd.read_parquet(tmp_path / "out" / "accepted.parquet")
    damaged_keys = {f"cam/{name}" for name in chosen if not name.startswith("intact_")}
    assert dict(zip(quarantine["key"], quarantine["reason"])) == dict.fromkeys(damaged_keys, "corrupt_data")
    assert set(accepted["key"]) == {f"cam/{name}" for name in chosen if name.startswith("intact_")}
    assert manifest["counts"]["quarantined"] == len(damaged_keys)
    assert all(re.search(r"Corrupt JPEG data", text) for text in quarantine["error"])


def test_the_sagemaker_job_installs_the_strict_decoder():
    """The validation job imports simplejpeg; a SageMaker job installs only the package's requirements.txt."""
    requirements = build_code_package().files["requirements.txt"].decode().splitlines()
    assert f"simplejpeg=={version('simplejpeg')}" in requirements

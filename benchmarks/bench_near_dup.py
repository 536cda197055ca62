"""`near_dup`: recall of planted near-duplicate copies, the false pairs found, and seconds per million hashes.

Planted: demo scenes (parts on a work surface, so unrelated images share a look: a fair test of false
pairs), each stored as a JPEG and as three copies: re-encoded at quality 50, resized to half, and
cropped by 2% on every side. Every file is hashed as validation hashes it (`check_image_bytes`: the
strict 1/8-scale decode, then the hash of that picture). A planted pair is found when the original and
its copy share a near-duplicate group; a false pair is a pair within the distance between images of
two different scenes, counted over every pair found. The speed line groups a million hashes: the
planted ones and uniform random ones (what the band join costs; real hash sets cluster more).
"""

from __future__ import annotations

import io
import time

import numpy as np
from PIL import Image

from training_code.lib import jpeg_strict
from training_code.lib.image_checks import DEFAULT_ALLOWED_FORMATS, check_image_bytes
from training_code.lib.near_duplicates import NearDuplicateSettings, near_duplicate_groups
from training_code.lib.perceptual_hash import as_unsigned, hamming, phash_pixels
from zero_assets.ops.demo_scenes import render_scene

from .report import BenchResult

SCENES, SIDES, CROP = 200, (640, 480), 0.02
MILLION = 1_000_000
COPIES = ("reencoded", "resized", "cropped")  # the kinds `copies` makes, in its order
SETTINGS = NearDuplicateSettings()


def jpeg(image: Image.Image, quality: int) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, "JPEG", quality=quality)
    return buffer.getvalue()


def copies(image: Image.Image) -> dict[str, bytes]:
    width, height = image.size
    dx, dy = round(width * CROP), round(height * CROP)
    return {
        "reencoded": jpeg(image, 50),
        "resized": jpeg(image.resize((width // 2, height // 2), Image.Resampling.LANCZOS), 85),
        "cropped": jpeg(image.crop((dx, dy, width - dx, height - dy)), 85),
    }


def validated_phash(data: bytes) -> int:
    verdict = check_image_bytes(data, DEFAULT_ALLOWED_FORMATS, min_side=16)
    if verdict.phash is None:
        raise RuntimeError(f"a planted image was not accepted: {verdict.reason} {verdict.error}")
    return verdict.phash


def phash_seconds(files: list[bytes]) -> float:
    """The hash's own cost a file: of the 1/8-scale picture the validator's strict decode made."""
    smalls = [jpeg_strict.decode_small(data, grey=True) for data in files]  # the photos are RGB: their luma
    started = time.perf_counter()
    for small in smalls:
        phash_pixels(small)
    return (time.perf_counter() - started) / len(smalls)


def planted_hashes() -> tuple[np.ndarray, np.ndarray, np.ndarray, float, float]:
    """(hash, scene, kind) per planted file, kind 0 the original; the validator's seconds a file, and
    the hash's part of them."""
    hashes, scenes, kinds, spent, hashing = [], [], [], 0.0, 0.0
    for scene in range(SCENES):
        image = render_scene(np.random.default_rng(10_000 + scene), *SIDES)[0].convert("RGB")
        files = [jpeg(image, 90), *copies(image).values()]
        started = time.perf_counter()
        hashes += [validated_phash(data) for data in files]
        spent += time.perf_counter() - started
        hashing += phash_seconds(files) * len(files)
        scenes += [scene] * len(files)
        kinds += list(range(len(files)))
    return as_unsigned(hashes), np.array(scenes), np.array(kinds), spent / len(hashes), hashing / len(hashes)


def run() -> list[BenchResult]:
    hashes, scenes, kinds, check_s, phash_s = planted_hashes()
    groups = near_duplicate_groups(hashes, SETTINGS)
    original = np.flatnonzero(kinds == 0)[scenes]  # each file's scene's original
    found = groups.group == groups.group[original]
    recall = {name: float(found[kinds == kind].mean()) for kind, name in enumerate(COPIES, start=1)}
    copies_found = float(found[kinds != 0].mean())
    # Every near pair among the planted files, from the pairs the bands found between distinct hashes.
    distinct_at = np.searchsorted(groups.distinct, hashes)
    scene_sets = [set() for _ in groups.distinct]
    for at, scene in zip(distinct_at.tolist(), scenes.tolist()):
        scene_sets[at].add(scene)
    pairs = list(zip(groups.pairs.left.tolist(), groups.pairs.right.tolist()))
    false_pairs = sum(1 for a, b in pairs if not scene_sets[a] & scene_sets[b])
    same_hash_false = sum(len(s) - 1 for s in scene_sets if len(s) > 1)  # different scenes, equal hashes
    found_pairs = len(pairs) + int(np.sum([len(s) > 1 for s in scene_sets]))
    false_rate = (false_pairs + same_hash_false) / max(1, found_pairs)
    true_distances = hamming(hashes[kinds != 0], hashes[original[kinds != 0]])

    rng = np.random.default_rng(0)
    million = np.concatenate([hashes, rng.integers(0, 2**64, MILLION - len(hashes), dtype=np.uint64)])
    started = time.perf_counter()
    big = near_duplicate_groups(million, SETTINGS)
    group_s = time.perf_counter() - started
    settings = {"max_distance": SETTINGS.max_distance, "band_bits": SETTINGS.band_bits, "layouts": SETTINGS.layouts}
    return [
        BenchResult(
            "near_dup",
            copies_found,
            ">=0.95",
            {
                **{f"recall_{name}": value for name, value in recall.items()},
                "false_pair_rate": false_rate,
                "s_per_million_hashes": group_s * MILLION / len(million),
                "candidates_per_million": big.pairs.candidates * MILLION / len(million),
                "validate_ms_per_file": check_s * 1e3,
                "phash_us_per_file": phash_s * 1e6,
                "copy_distance_p90": float(np.percentile(true_distances, 90)),
                "scenes": SCENES,
                **settings,
            },
        ),
        BenchResult(
            "near_dup_false_pairs",
            false_rate,
            "<=0.01",
            {"false_pairs": false_pairs + same_hash_false, "pairs_found": found_pairs, "planted_files": len(hashes)},
        ),
    ]

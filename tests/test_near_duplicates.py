"""The perceptual hash and the near-duplicate grouping: copies hash close, others far, and the grouping
finds every pair the bands promise, checked against all pairs compared."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from training_code.lib import perceptual_hash as ph
from training_code.lib.image_checks import DEFAULT_ALLOWED_FORMATS, check_image_bytes
from training_code.lib.near_duplicates import (
    NearDuplicateSettings,
    band_values,
    connected_components,
    near_duplicate_groups,
    near_duplicate_pairs,
)
from zero_assets.ops.demo_scenes import encode_file, render_scene


def scene(seed: int, size=(320, 240)) -> Image.Image:
    return render_scene(np.random.default_rng(seed), *size)[0].convert("RGB")


def reencoded(image: Image.Image, fmt: str = "JPEG", **options) -> Image.Image:
    buffer = io.BytesIO()
    image.save(buffer, fmt, **options)
    decoded = Image.open(io.BytesIO(buffer.getvalue()))
    decoded.load()
    return decoded


def distance(a: int, b: int) -> int:
    return int(ph.hamming(ph.as_unsigned([a]), ph.as_unsigned([b]))[0])


def test_copies_hash_close_and_other_scenes_far():
    original = scene(1)
    width, height = original.size
    base = ph.phash(original)
    copies = {
        "jpeg q50": reencoded(original, quality=50),
        "png": reencoded(original, "PNG"),
        "half size": reencoded(original.resize((width // 2, height // 2)), quality=85),
        "2% cropped": reencoded(original.crop((6, 5, width - 6, height - 5)), quality=85),
    }
    for name, copy in copies.items():
        assert distance(base, ph.phash(copy)) <= 8, name
    others = [distance(base, ph.phash(scene(seed))) for seed in range(2, 12)]
    assert min(others) > 10, others


def test_the_hash_is_of_the_upright_picture():
    upright = scene(3)
    # Stored turned 90 degrees with EXIF orientation 6 ("rotate 270 to show"): as exif_transpose shows it.
    stored = upright.transpose(Image.Transpose.ROTATE_90)
    assert distance(ph.phash(stored, orientation=6), ph.phash(upright)) <= 3  # resampling rounds apart
    assert distance(ph.phash(stored), ph.phash(upright)) > 10


@pytest.mark.parametrize("orientation", [1, 3, 6, 8])
def test_the_validator_hashes_a_turned_jpeg_as_its_upright_png(orientation):
    """The two decode paths: a JPEG's 1/8-scale strict decode turned by its EXIF tag, a PNG's full decode."""
    upright = scene(5, (480, 360))
    # The stored frame whose EXIF `orientation` shows `upright` (exif_transpose undoes these turns).
    turn = {1: None, 3: Image.Transpose.ROTATE_180, 6: Image.Transpose.ROTATE_90, 8: Image.Transpose.ROTATE_270}
    stored = upright.transpose(turn[orientation]) if turn[orientation] else upright
    jpeg = check_image_bytes(encode_file(stored, "JPEG", orientation), DEFAULT_ALLOWED_FORMATS, 8)
    png = check_image_bytes(encode_file(upright, "PNG", 1), DEFAULT_ALLOWED_FORMATS, 8)
    assert (jpeg.orientation, jpeg.width, png.width) == (orientation, 480, 480)
    assert distance(jpeg.phash, png.phash) <= 4
    assert distance(jpeg.phash, ph.phash(stored)) > 10 or orientation == 1


@pytest.mark.parametrize("mode", ["L", "P", "RGBA", "CMYK", "I;16", "I", "F", "1", "LA"])
def test_every_decoded_mode_hashes(mode):
    original = scene(4)
    if mode in ("I;16", "I", "F"):
        converted = Image.fromarray((np.asarray(original.convert("L"), np.uint16) * 257).astype(np.uint16))
        converted = converted.convert(mode) if mode != "I;16" else converted
    else:
        converted = original.convert(mode)
    value = ph.phash(converted)
    assert -(2**63) <= value < 2**63
    if mode not in ("1",):  # bilevel keeps too little of the picture to be near it
        assert distance(value, ph.phash(original)) <= 6, mode


def test_signed_storage_round_trips_the_bits():
    for bits in (0, 1, 2**63 - 1, 2**63, 2**64 - 1):
        assert int(ph.as_unsigned([ph.to_signed(bits)])[0]) == bits


def brute_force_pairs(hashes: np.ndarray, max_distance: int) -> set[tuple[int, int]]:
    left, right = np.triu_indices(len(hashes), 1)
    near = ph.hamming(hashes[left], hashes[right]) <= max_distance
    return set(zip(left[near].tolist(), right[near].tolist()))


def planted_hashes(rng: np.random.Generator, originals: int, flips: list[int]) -> np.ndarray:
    base = rng.integers(0, 2**63, originals, dtype=np.int64).view(np.uint64) * np.uint64(2) + np.uint64(1)
    copies = []
    for count in flips:
        masks = np.zeros(originals, np.uint64)
        for row in range(originals):
            for bit in rng.choice(64, count, replace=False):
                masks[row] |= np.uint64(1) << np.uint64(bit)
        copies.append(base ^ masks)
    return np.unique(np.concatenate([base, *copies]))


def test_pairs_are_those_within_the_distance_that_share_a_band():
    rng = np.random.default_rng(7)
    settings = NearDuplicateSettings(max_distance=10, band_bits=16, layouts=2)
    hashes = planted_hashes(rng, 400, [2, 3, 6, 9])
    found = near_duplicate_pairs(hashes, settings)
    pairs = set(zip(found.left.tolist(), found.right.tolist()))
    truth = brute_force_pairs(hashes, settings.max_distance)
    bands = np.stack(band_values(hashes, settings))
    share_a_band = {(a, b) for a, b in truth if (bands[:, a] == bands[:, b]).any()}
    assert pairs == share_a_band
    assert {(a, b) for a, b in truth if distance_of(hashes, a, b) <= 3} <= pairs  # 4 bands a layout: up to 3 bits
    assert found.candidates >= len(pairs)
    assert np.array_equal(found.distance, ph.hamming(hashes[found.left], hashes[found.right]))


def distance_of(hashes: np.ndarray, a: int, b: int) -> int:
    return int(ph.hamming(hashes[[a]], hashes[[b]])[0])


def python_components(count: int, edges: list[tuple[int, int]]) -> list[int]:
    parent = list(range(count))

    def root(node: int) -> int:
        while parent[node] != node:
            node = parent[node]
        return node

    for a, b in edges:
        low, high = sorted((root(a), root(b)))
        parent[high] = low
    return [root(node) for node in range(count)]


@pytest.mark.parametrize("seed", range(5))
def test_connected_components_match_a_plain_union_find(seed):
    rng = np.random.default_rng(seed)
    count = 300
    edges = [tuple(rng.integers(0, count, 2).tolist()) for _ in range(200)]
    edges += [(n, n + 1) for n in range(100, 160)]  # a long chain
    left, right = np.array([e[0] for e in edges]), np.array([e[1] for e in edges])
    assert connected_components(count, left, right).tolist() == python_components(count, edges)


def test_groups_join_equal_hashes_and_chains_named_by_their_first_image():
    settings = NearDuplicateSettings(max_distance=2)
    far = np.uint64(0xF0F0F0F0F0F0F0F0)
    hashes = np.array([far, 0b0, 0b111, far, 0b1, 0b11, 0xFFFF00000000FFFF], dtype=np.uint64)
    groups = near_duplicate_groups(hashes, settings)
    # 0b0 - 0b1 - 0b11 - 0b111 are each 1 bit apart: one group through the chain, as its first image 1
    assert groups.group.tolist() == [0, 1, 1, 0, 1, 1, 6]


def test_settings_are_checked():
    with pytest.raises(ValueError, match="band_bits"):
        NearDuplicateSettings(band_bits=10)
    with pytest.raises(ValueError, match="max_distance"):
        NearDuplicateSettings(max_distance=64)
    with pytest.raises(ValueError, match="distinct"):
        near_duplicate_pairs(np.array([1, 1], np.uint64), NearDuplicateSettings())

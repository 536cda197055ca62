"""Near-duplicate groups: images whose perceptual hashes are a few bits apart, found without comparing all pairs.

Multi-index hashing: the 64 bits are cut into bands (`band_bits` wide, in `layouts` orders of the
bits: the first as stored, each further one a fixed permutation), and a pair is a candidate when its
two hashes are equal on one band, found by a join in Arrow per band. Two hashes `d` bits apart that
differ in no bit of some band are found; with 4 bands a layout every pair up to 3 bits apart is, and
further ones by chance that more layouts raise (benchmarks/bench_near_dup.py measures it). Each
candidate is then checked by its full Hamming distance, and the pairs within `max_distance` are
joined into groups (connected components, so a group can hold pairs further apart through others).

Equal hashes are grouped first and each distinct hash is joined once: a thousand copies of one
blank frame cost one row, not a million pairs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from training_code.lib.perceptual_hash import BITS, hamming

JOIN_ROWS = 1 << 18  # rows of one band joined with the rest at a time
LAYOUT_SEED = 22  # the bit orders are part of the method: fixed, so the same hashes give the same candidates


@dataclass(frozen=True)
class NearDuplicateSettings:
    # Bits; pairs at most this far apart are near-duplicates. 8: bench_near_dup's planted copies are found
    # (p90 4 bits apart) and pairs of unrelated demo scenes stay under 1% of the pairs found.
    max_distance: int = 8
    band_bits: int = 16
    layouts: int = 4

    def __post_init__(self) -> None:
        if not 0 <= self.max_distance < BITS:
            raise ValueError(f"near-duplicate max_distance must be within 0..{BITS - 1} bits, got {self.max_distance}")
        if self.band_bits <= 0 or BITS % self.band_bits:
            raise ValueError(f"near-duplicate band_bits must divide {BITS}, got {self.band_bits}")
        if self.layouts < 1:
            raise ValueError(f"near-duplicate layouts must be 1 or more, got {self.layouts}")


@dataclass(frozen=True)
class NearDuplicatePairs:
    left: np.ndarray  # indices into the hashes given, left < right
    right: np.ndarray
    distance: np.ndarray
    candidates: int  # candidate pairs the bands proposed (once per band they share), each checked by its distance


def bit_orders(layouts: int) -> list[np.ndarray]:
    """The bit order of each layout: as stored, then fixed permutations."""
    rng = np.random.default_rng(LAYOUT_SEED)
    return [np.arange(BITS)] + [rng.permutation(BITS) for _ in range(layouts - 1)]


def band_values(hashes: np.ndarray, settings: NearDuplicateSettings) -> list[np.ndarray]:
    """Each band's value for every hash (uint64 bits), layout by layout: the band's bits, in its
    layout's order, packed into one integer (bit 63 of a hash is its first bit)."""
    bands = []
    for order in bit_orders(settings.layouts):
        for start in range(0, BITS, settings.band_bits):
            value = np.zeros(len(hashes), dtype=np.uint64)
            for position in order[start : start + settings.band_bits]:
                value = (value << np.uint64(1)) | ((hashes >> np.uint64(BITS - 1 - position)) & np.uint64(1))
            bands.append(value)
    return bands


def near_duplicate_pairs(hashes: np.ndarray, settings: NearDuplicateSettings) -> NearDuplicatePairs:
    """Every pair of distinct `hashes` (uint64, no value twice) at most `settings.max_distance` apart that
    shares a band."""
    hashes = np.asarray(hashes, dtype=np.uint64)
    if len(np.unique(hashes)) != len(hashes):
        raise ValueError("near_duplicate_pairs takes distinct hashes; group equal ones first (near_duplicate_groups)")
    at = pa.array(np.arange(len(hashes), dtype=np.int32))
    near, candidates = [], 0
    for band in band_values(hashes, settings):
        table = pa.table({"band": pa.array(band), "at": at})
        # A slice of the rows joined with all of them at a time, each candidate checked at once and only
        # the near ones kept: memory stays a few slices' candidates, however many the whole join proposes.
        for start in range(0, len(hashes), JOIN_ROWS):
            joined = table.slice(start, JOIN_ROWS).join(table, keys="band", right_suffix="_other", use_threads=True)
            left = joined.column("at").to_numpy().astype(np.int64)
            right = joined.column("at_other").to_numpy().astype(np.int64)
            ordered = left < right
            left, right = left[ordered], right[ordered]
            candidates += len(left)
            close = hamming(hashes[left], hashes[right]) <= settings.max_distance
            near.append(left[close] * len(hashes) + right[close])
    # A pair equal on several bands is found once per band: kept once.
    codes = np.unique(np.concatenate(near)) if near else np.zeros(0, np.int64)
    left, right = codes // max(1, len(hashes)), codes % max(1, len(hashes))
    return NearDuplicatePairs(left, right, hamming(hashes[left], hashes[right]), candidates)


def connected_components(count: int, left: np.ndarray, right: np.ndarray) -> np.ndarray:
    """Each of `count` nodes' component, named by its smallest node, for the edges (left[i], right[i])."""
    label = np.arange(count, dtype=np.int64)
    left, right = np.asarray(left, np.int64), np.asarray(right, np.int64)
    while True:
        # Hook each edge's larger label to the smaller one, then jump to the roots: each round at least
        # halves the depth, so a chain of n nodes takes about log n rounds, not n.
        low = np.minimum(label[left], label[right])
        before = label.copy()
        np.minimum.at(label, label[left], low)
        np.minimum.at(label, label[right], low)
        while not np.array_equal(label, label[label]):
            label = label[label]
        if np.array_equal(label, before):
            return label


@dataclass(frozen=True)
class NearDuplicateGroups:
    group: np.ndarray  # per hash given: its group, named by the smallest index in it; its own index when alone
    pairs: NearDuplicatePairs  # between distinct hash values (indices into `distinct`)
    distinct: np.ndarray  # the distinct hash values, sorted


def near_duplicate_groups(hashes: np.ndarray, settings: NearDuplicateSettings) -> NearDuplicateGroups:
    """Group `hashes` (uint64, one per image, repeats allowed): equal hashes and those linked through
    pairs at most `settings.max_distance` bits apart share a group."""
    hashes = np.asarray(hashes, dtype=np.uint64)
    distinct, inverse = np.unique(hashes, return_inverse=True)
    pairs = near_duplicate_pairs(distinct, settings)
    component = connected_components(len(distinct), pairs.left, pairs.right)[inverse]
    # Name each group by its first image (smallest index), whatever its hash sorts as.
    first = np.full(len(distinct), len(hashes), dtype=np.int64)
    np.minimum.at(first, component, np.arange(len(hashes), dtype=np.int64))
    return NearDuplicateGroups(first[component], pairs, distinct)

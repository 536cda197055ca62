"""The order one training rank reads its samples in: shards' row ranges dealt to ranks each epoch (seeded,
balanced), read in up to `open_shards` lanes, then through a seeded shuffle buffer."""

from __future__ import annotations

import heapq
import itertools
import random
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TypeVar

_PRIME = 1_000_003
T = TypeVar("T")


@dataclass(frozen=True)
class Piece:
    shard: int  # index into the job's shard list
    start: int  # rows [start, stop) of that shard
    stop: int
    source: str

    @property
    def rows(self) -> int:
        return self.stop - self.start


def cut_pieces(rows: Sequence[int], sources: Sequence[str], world_size: int, spread: int) -> list[Piece]:
    """Every shard cut into about equal row ranges, enough for each source to reach every rank."""
    if sum(rows) < world_size:
        raise ValueError(f"{sum(rows)} rows cannot give each of {world_size} ranks rows of its own")
    shards_of: dict[str, int] = {}
    for count, source in zip(rows, sources):
        shards_of[source] = shards_of.get(source, 0) + (1 if count else 0)
    cuts = {source: min(world_size, -(-spread * world_size // max(1, n))) for source, n in shards_of.items()}
    while sum(min(count, cuts[source]) for count, source in zip(rows, sources)) < world_size:
        cuts = {source: min(world_size, cut + 1) for source, cut in cuts.items()}  # small shards: fewer pieces
    pieces = []
    for shard, (count, source) in enumerate(zip(rows, sources)):
        parts = min(count, cuts[source])
        bounds = [count * k // parts for k in range(parts + 1)] if parts else []
        pieces += [Piece(shard, start, stop, source) for start, stop in itertools.pairwise(bounds)]
    return pieces


def deal_to_ranks(pieces: list[Piece], world_size: int, rng: random.Random) -> list[list[Piece]]:
    """Deal each shard's pieces to different ranks, balancing each source's rows and the total."""
    groups = list(_by_source(pieces, rng).values())
    rng.shuffle(groups)
    dealt: list[list[Piece]] = [[] for _ in range(world_size)]
    loads = [0] * world_size
    for group in groups:
        by_shard: dict[int, list[Piece]] = {}
        for piece in group:  # in the group's seeded order: shards in the order their first piece comes
            by_shard.setdefault(piece.shard, []).append(piece)
        # (rows of this source, rows in all, rank): only the ranks popped change, so the heap stays valid.
        taken = [(0, loads[rank], rank) for rank in range(world_size)]
        heapq.heapify(taken)
        for shard_pieces in by_shard.values():
            shard_pieces.sort(key=lambda piece: -piece.rows)  # stable: equal sizes keep the seeded order
            takers = [heapq.heappop(taken) for _ in shard_pieces]  # never more pieces than ranks
            for piece, (source_rows, _, rank) in zip(shard_pieces, takers):
                dealt[rank].append(piece)
                loads[rank] += piece.rows
                heapq.heappush(taken, (source_rows + piece.rows, loads[rank], rank))
    return dealt


def _by_source(pieces: list[Piece], rng: random.Random) -> dict[str, list[Piece]]:
    """Source -> its pieces in a seeded order; sources in name order."""
    by_source: dict[str, list[Piece]] = {}
    for piece in sorted(pieces, key=lambda p: (p.source, p.shard, p.start)):
        by_source.setdefault(piece.source, []).append(piece)
    for group in by_source.values():
        rng.shuffle(group)
    return by_source


def _least_loaded(items: list[T], count: int, rows: Callable[[T], int] = lambda piece: piece.rows) -> list[list[T]]:
    """`items` in order, each to the bin with the fewest rows so far (ties: the lowest): `count` bins."""
    bins: list[list[T]] = [[] for _ in range(count)]
    loads = [(0, index) for index in range(count)]
    for item in items:
        load, index = heapq.heappop(loads)
        bins[index].append(item)
        heapq.heappush(loads, (load + rows(item), index))
    return bins


def _interleaved(groups: list[list[Piece]], rng: random.Random) -> list[Piece]:
    """Several sources' pieces in one lane, each source's spread evenly along it (seeded phase per source)."""
    placed = []
    for group in groups:
        phase = rng.random()
        placed += [((index + phase) / len(group), piece.shard, piece.start, piece) for index, piece in enumerate(group)]
    return [entry[-1] for entry in sorted(placed, key=lambda entry: entry[:3])]


def plan_lanes(pieces: list[Piece], open_shards: int, rng: random.Random) -> list[list[Piece]]:
    """At most `open_shards` lanes, each a sequence of pieces read one after the other."""
    by_source = _by_source(pieces, rng)
    rows = {source: sum(p.rows for p in group) for source, group in by_source.items()}
    sources = sorted(by_source, key=lambda s: (-rows[s], s))
    if len(sources) > open_shards:  # more sources than lanes: sources share lanes, balanced by rows
        bins = _least_loaded(sources, open_shards, rows.__getitem__)
        return [_interleaved([by_source[s] for s in sorted(names)], rng) for names in bins if names]
    # One lane per source, then the spare lanes to the sources with the most rows per lane (never more
    # lanes than pieces): a big source is read from several places at once.
    lanes = dict.fromkeys(sources, 1)
    spare = open_shards - len(sources)
    wanting = [(-rows[s], s) for s in sources if len(by_source[s]) > 1]
    heapq.heapify(wanting)
    while spare > 0 and wanting:
        _, source = heapq.heappop(wanting)
        lanes[source] += 1
        spare -= 1
        if lanes[source] < len(by_source[source]):
            heapq.heappush(wanting, (-rows[source] / lanes[source], source))
    return [lane for source in sources for lane in _least_loaded(by_source[source], lanes[source]) if lane]


def _lane_rows(lane: list[Piece], phase: float) -> Iterator[tuple[float, int, int]]:
    """(time in [0, 1), shard, row) for every row of the lane: its rows evenly spaced over the epoch."""
    total = sum(piece.rows for piece in lane)
    count = 0
    for piece in lane:
        for row in range(piece.start, piece.stop):
            yield (count + phase) / total, piece.shard, row
            count += 1


def shuffled(pairs: Iterable[tuple[int, int]], buffer_size: int, rng: random.Random) -> Iterator[tuple[int, int]]:
    """The pairs through a seeded shuffle buffer of `buffer_size` entries."""
    buffer: list[tuple[int, int]] = []
    for pair in pairs:
        if len(buffer) < max(1, buffer_size):
            buffer.append(pair)
            continue
        slot = rng.randrange(len(buffer))
        yield buffer[slot]
        buffer[slot] = pair
    rng.shuffle(buffer)
    yield from buffer


def rank_epoch(
    rows: Sequence[int],
    sources: Sequence[str],
    *,
    seed: int,
    epoch: int,
    rank: int,
    world_size: int,
    open_shards: int,
    shuffle_buffer: int,
) -> Iterator[tuple[int, int]]:
    """(shard index, row) pairs rank `rank` reads in `epoch`."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not within world size {world_size}")
    if open_shards < 1:
        raise ValueError(f"open_shards must be at least 1, got {open_shards}")
    # The same generator on every rank: they agree on the deal without talking.
    pieces = cut_pieces(rows, sources, world_size, open_shards)
    dealt = deal_to_ranks(pieces, world_size, random.Random(seed * _PRIME + epoch))
    rng = random.Random((seed * _PRIME + epoch) * _PRIME + rank)
    lanes = plan_lanes(dealt[rank], open_shards, rng)
    merged = heapq.merge(*(_lane_rows(lane, rng.random()) for lane in lanes))
    yield from shuffled(((shard, row) for _, shard, row in merged), shuffle_buffer, rng)

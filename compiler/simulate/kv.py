"""Where KV lives and how it moves: a rank's own prefix cache, the Mooncake pool over DRAM
(and HBM) segments, and the links hand-offs and pool loads queue on.

A cache entry is one session's context prefix (its blocks, counted in tokens): a request that
continues the session reads the cached part of its `reuse` tokens and computes the rest.
"""

from collections import OrderedDict
from dataclasses import dataclass, field

SPREAD_HASH = 2654435761  # Knuth's multiplicative hash


class PrefixCache:
    """vLLM's prefix cache on one rank: free KV blocks keep the prefixes of finished
    prompts until they are needed (least recently used first)."""

    def __init__(self, tokens: int) -> None:
        self.capacity = max(0, tokens)
        self.used = 0
        self.entries: OrderedDict[int, int] = OrderedDict()
        self.evicted: list[int] = []  # keys dropped by `put`, for an index to forget
        self.track = False

    def hit(self, key: int, want: int) -> int:
        have = self.entries.get(key)
        if have is None or want <= 0:
            return 0
        self.entries.move_to_end(key)
        return have if have < want else want

    def peek(self, key: int, want: int) -> int:
        """What `hit` would find, without touching the recency order."""
        return min(self.entries.get(key, 0), max(0, want))

    def put(self, key: int, tokens: int) -> None:
        cap, entries = self.capacity, self.entries
        if tokens > cap:
            tokens = cap
        used = self.used - entries.pop(key, 0)
        while entries and used + tokens > cap:
            gone, size = entries.popitem(last=False)
            used -= size
            if self.track:
                self.evicted.append(gone)
        if tokens > 0:
            entries[key] = tokens
            used += tokens
        self.used = used


@dataclass
class PoolSegment:
    tray: str
    cache: PrefixCache
    alive: bool = True
    system: str = ""  # its tray's system (a mixed fleet's trays differ)


@dataclass
class Pool:
    """The Mooncake store: objects (a session's prefix) live on one segment each, placed on
    a segment by key; a full segment evicts its least recently used objects; a failed
    tray's segment and its objects are gone."""

    segments: list[PoolSegment]
    where: dict[int, int] = field(default_factory=dict)  # session -> segment index
    live: list[int] = field(default_factory=list)
    systems: dict[str, str] = field(default_factory=dict)  # tray -> its system

    def __post_init__(self) -> None:
        self.live = [i for i, s in enumerate(self.segments) if s.alive]
        self.systems = {s.tray: s.system for s in self.segments}
        for s in self.segments:
            s.cache.track = True

    @property
    def capacity(self) -> int:
        return sum(s.cache.capacity for s in self.segments if s.alive)

    @property
    def used(self) -> int:
        return sum(s.cache.used for s in self.segments if s.alive)

    def hit(self, key: int, want: int) -> tuple[int, str | None]:
        """(tokens found, the tray they load from)."""
        i = self.where.get(key)
        if i is None:
            return 0, None
        seg = self.segments[i]
        if key not in seg.cache.entries:  # evicted meanwhile
            del self.where[key]
            return 0, None
        got = seg.cache.hit(key, want)
        return (got, seg.tray) if got else (0, None)

    def system_of(self, tray: str) -> str:
        return self.systems.get(tray, "")

    def peek(self, key: int, want: int) -> int:
        i = self.where.get(key)
        return 0 if i is None else self.segments[i].cache.peek(key, want)

    def put(self, key: int, tokens: int) -> None:
        """Store (or refresh) a session's prefix: on the segment it is on, else on the live
        segment its key hashes to (assumed: the master spreads objects evenly)."""
        if tokens <= 0 or not self.live:
            return
        where = self.where
        i = where.get(key)
        if i is None:
            i = self.live[(key * SPREAD_HASH) % (1 << 32) % len(self.live)]
            where[key] = i
        cache = self.segments[i].cache
        cache.put(key, tokens)
        if key not in cache.entries:
            del where[key]
        if cache.evicted:
            for gone in cache.evicted:
                where.pop(gone, None)
            cache.evicted.clear()

    def fail(self, trays: set[str]) -> int:
        """Drop the segments on `trays`; the tokens lost."""
        lost = 0
        for s in self.segments:
            if s.alive and s.tray in trays:
                s.alive = False
                lost += s.cache.used
                for key in s.cache.entries:
                    self.where.pop(key, None)
                s.cache.entries.clear()
                s.cache.used = 0
        self.live = [i for i, s in enumerate(self.segments) if s.alive]
        return lost


class Links:
    """First come, first served links: a transfer starts when the data is ready and every
    link it crosses is free, and holds them for its duration (NIXL moves one request's KV
    at a time per link; concurrent transfers share a link by queueing, the same total)."""

    def __init__(self) -> None:
        self.free_at: dict[str, float] = {}
        self.busy_us: dict[str, float] = {}

    def reserve(self, links: tuple[str, ...], ready: float, duration: float) -> float:
        """The finish time of a transfer over `links`."""
        free_at, busy = self.free_at, self.busy_us
        start = ready
        for k in links:
            t = free_at.get(k, 0.0)
            if t > start:
                start = t
        end = start + duration
        for k in links:
            free_at[k] = end
            busy[k] = busy.get(k, 0.0) + duration
        return end

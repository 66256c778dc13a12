"""Writing into the store: pack writers, the store writer a write stores payloads through (each
distinct payload once, looked up and checked first), and store references."""

from __future__ import annotations

import contextlib
import functools
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from blobhouse.errors import (
    ExternalBlobError,
    InvalidInputError,
    StoreIndexWarning,
)
from blobhouse.files.session import PreparedBlob, SidecarFile, WriteQueue
from blobhouse.io.objects import StorageOptions
from blobhouse.io.uris import normalize_uri
from blobhouse.layout import (
    PACK_NAME,
    PACKS_DIR,
    pack_name,
    store_dir,
)
from blobhouse.placement import object_size
from blobhouse.store.checks import checked_entries
from blobhouse.store.claims import ENTRY_CLAIMS, PROBE, Claim, Claims, SharingOdds
from blobhouse.store.index import StoreIndex, open_index
from blobhouse.store.packs import StoredPayload, remove_packs, retired_packs

if TYPE_CHECKING:
    from lance import LanceDataset

    from blobhouse.values import LogicalColumn


class PackWriter:
    """The packs one writing process adds to the store, rolled over at ``limit`` bytes.

    >>> import tempfile
    >>> from blobhouse.dedup import content_hash
    >>> packs = PackWriter(tempfile.mkdtemp(), "w1-", WriteQueue(), limit=1 << 20)
    >>> first = packs.write(b"hello", content_hash(b"hello"))
    >>> (first.position, first.size), packs.write(b"world", content_hash(b"world")).position
    ((0, 5), 5)
    >>> packs.finish(); len(packs.packs)
    1
    """

    def __init__(
        self,
        table_path: str,
        name_prefix: str,
        queue: WriteQueue,
        limit: int,
        storage_options: StorageOptions | None = None,
    ) -> None:
        self.table_path = table_path
        self.root = store_dir(table_path)
        self.name_prefix = name_prefix
        self.queue = queue
        self.limit = limit
        self.storage_options = storage_options
        self.packs: list[str] = []
        self.stored: list[StoredPayload] = []
        self._file: SidecarFile | None = None
        self._files: list[SidecarFile] = []
        self._upcoming: list[str] = []  # the names the next new packs get, in order
        self._size = 0

    def places(self, sizes: Sequence[int]) -> list[tuple[str, int]]:
        """The pack and position each of the next payloads of ``sizes`` bytes goes to, written
        in this order (a new pack past the size limit), so that they can be claimed before they
        are written (nothing is created until it is).

        >>> import tempfile
        >>> packs = PackWriter(tempfile.mkdtemp(), "w1-", WriteQueue(), limit=8)
        >>> planned = packs.places([5, 3, 4])
        >>> [position for _, position in planned], len({pack for pack, _ in planned})
        ([0, 5, 0], 2)
        >>> stored = packs.write_many([b"abcde", b"fgh", b"ijkl"], [b"1", b"2", b"3"])
        >>> [(s.pack, s.position) for s in stored] == planned
        True
        """
        out: list[tuple[str, int]] = []
        pack = self.packs[-1] if self._file is not None else None
        size, opened = self._size, 0
        for payload in sizes:
            if pack is not None and size and size + payload > self.limit:
                pack = None
            if pack is None:
                if opened == len(self._upcoming):
                    self._upcoming.append(pack_name(self.name_prefix))
                pack, size = self._upcoming[opened], 0
                opened += 1
            out.append((pack, size))
            size += payload
        return out

    def write(self, payload: bytes | memoryview, digest: bytes) -> StoredPayload:
        """Append ``payload`` to the current pack (a new one past the size limit)."""
        if self._file is not None and self._size and self._size + len(payload) > self.limit:
            self._close()
        if self._file is None:
            if not self._upcoming:
                self._upcoming.append(pack_name(self.name_prefix))
            pack = self._upcoming.pop(0)
            uri = f"{self.root}/{pack}"
            self._file = SidecarFile(uri, self.queue, self.storage_options, fresh=True)
            self._files.append(self._file)
            self.packs.append(pack)
            self._size = 0
        stored = StoredPayload(digest, self.packs[-1], self._size, len(payload))
        self._file.write(payload)
        self._size += len(payload)
        self.stored.append(stored)
        return stored

    def write_many(
        self, payloads: Sequence[bytes | memoryview], digests: Sequence[bytes]
    ) -> list[StoredPayload]:
        """:meth:`write` each of ``payloads`` (whose blake3 are ``digests``), in order: the
        payloads that fit the open pack are appended as one run (a column of small unique
        payloads spent most of its write in per-payload calls).

        >>> import tempfile
        >>> packs = PackWriter(tempfile.mkdtemp(), "w1-", WriteQueue(), limit=8)
        >>> payloads = [b"abc", b"defg", b"hi", b"jklmnopqr"]  # the third opens a pack, so
        >>> stored = packs.write_many(payloads, [b"d1", b"d2", b"d3", b"d4"])  # does the 4th
        >>> [(s.digest, s.position, s.size) for s in stored], len({s.pack for s in stored})
        ([(b'd1', 0, 3), (b'd2', 3, 4), (b'd3', 0, 2), (b'd4', 0, 9)], 3)
        >>> packs.finish(); packs.stored == stored
        True
        """
        stored: list[StoredPayload] = []
        at, count = 0, len(payloads)
        while at < count:
            first = self.write(payloads[at], digests[at])  # opens or rolls over the pack
            stored.append(first)
            pack, position, run = first.pack, self._size, []
            at += 1
            while at < count and position + len(payloads[at]) <= self.limit:
                size = len(payloads[at])
                stored.append(StoredPayload(digests[at], pack, position, size))
                run.append(payloads[at])
                position += size
                at += 1
            if run:
                self._file.write_many(run)
                self.stored.extend(stored[-len(run) :])
                self._size = position
        return stored

    def flush(self) -> None:
        """Hand the open pack's bytes so far to the queue (written once it drains)."""
        if self._file is not None:
            self._file.flush()

    def finish(self) -> None:
        """Close the current pack (its bytes are written once the queue drains)."""
        self._close()

    def abort_open(self) -> None:
        """Give up on packs still being written (after their queue stopped): an open one is
        aborted, never completed first."""
        for file in self._files:
            file.abort()
        self._file = None

    def _close(self) -> None:
        if self._file is not None:
            self._file.close(wait=False)
            self._file = None


class StoreWriter:
    """What one writing process adds to the store: payloads the index does not hold yet go
    to new packs; every data file of the write dedups against the index and against them.

    :meth:`place_many` looks a batch of payloads up in the index in one query (call it once
    per batch; :meth:`place` is one payload). :meth:`take_new` hands each data file the
    payloads added since the last call and the packs holding them (what its commit records in
    the index, and what its abort removes).
    """

    def __init__(
        self,
        table_path: str,
        base_id: int,
        name_prefix: str,
        pack_limit: int,
        storage_options: StorageOptions | None = None,
        load_index: bool = True,
        avoid: frozenset[str] = frozenset(),
        claims: Claims | None = None,
    ) -> None:
        self.base_id = base_id
        # the tasks of a Spark write claim new payloads, so that only one of them stores each
        self.claims = claims

        # a Spark write that joined its rows with the index already turned what it found into
        # references (see blobhouse.spark.write_table): no task needs the index
        def store_state() -> tuple[LanceDataset | None, frozenset[str]]:
            index = open_index(table_path, storage_options) if load_index else None
            return index, frozenset(retired_packs(table_path, storage_options))

        memory = claims.memory if claims is not None else None
        index, retired = memory.store_state(store_state) if memory else store_state()
        self.index = StoreIndex(table_path, index, storage_options)
        self.retired = retired | avoid  # packs never to reference
        self.found_packs: set[str] = set()  # packs found in the index: checked before commit
        self.damaged: set[StoredPayload] = set()  # index entries whose bytes differ from their key
        self.queue = WriteQueue()
        self.packs = PackWriter(table_path, name_prefix, self.queue, pack_limit, storage_options)
        # what this write references: payloads it stored, and payloads it found in the index
        self._written: dict[bytes, StoredPayload] = {}
        self._found: dict[bytes, StoredPayload] = {}
        # payloads another task of the write claimed and stores (checked at the commit)
        self.borrowed: dict[bytes, StoredPayload] = {}
        self.claimed = False  # it claimed payloads: its packs are kept if its task fails
        # per column: how often its claims turned out shared (claims.SharingOdds)
        self._odds: dict[str, SharingOdds] = {}
        self._unmet: dict[bytes, str] = {}  # claimed by this task, not met again yet
        # digest -> the reference its rows store, once decided: the same for every later row
        # (a column of small payloads repeats a few of them over millions of rows)
        self._references: dict[bytes, PreparedBlob] = {}
        self._reported = 0

    def place_many(
        self,
        payloads: Sequence[bytes | memoryview],
        digests: Sequence[bytes],
        column: str = "",
    ) -> list[PreparedBlob]:
        """The references of ``payloads`` (whose blake3 are ``digests``; of blob ``column``) in
        the store, writing only those the store lacks; the index is asked once for all, and
        the write's claim log once for those worth a claim (blobhouse.store.claims)."""
        written, found, borrowed = self._written, self._found, self.borrowed
        unknown = [
            d
            for d in dict.fromkeys(digests)
            if d not in written and d not in found and d not in borrowed
        ]
        repeated: set[bytes] = set()
        if self.claims is not None and len(unknown) < len(digests):
            seen: set[bytes] = set()
            repeated = {d for d in digests if d in seen or seen.add(d)}
        won: list[bytes] = []
        if unknown:
            sizes = {d: len(p) for p, d in zip(payloads, digests, strict=True)}
            self._found.update(self._checked(self.index.find_copies(unknown, self.retired), sizes))
            new = [d for d in unknown if d not in self._found]
            if self.claims is None:  # no other task to ask: the store lacks them, write them
                self._write_new(payloads, digests, new)
            elif new:
                won = self._claim_new(payloads, digests, new, column, repeated)
        references, unmet = self._references, self._unmet
        placed = [
            references[d] if d in references and d not in unmet else self._place(p, d)
            for p, d in zip(payloads, digests, strict=True)
        ]
        odds = self._column_odds(column) if won else None
        for digest in won:  # met again in this batch: shared; else maybe in a later one
            if digest in repeated:
                odds.shared()
            else:
                self._unmet[digest] = column
        return placed

    def _claim_new(
        self,
        payloads: Sequence[bytes | memoryview],
        digests: Sequence[bytes],
        new: list[bytes],
        column: str,
        repeated: set[bytes],
    ) -> list[bytes]:
        """Claim those of ``new`` (digests the store lacks, in the order first met) worth a
        claim in the write's log, store the ones this task won (in the places claimed), borrow
        the others'; the digests won. Those not worth a claim are left for :meth:`_place`."""
        first: dict[bytes, bytes | memoryview] = {}
        for payload, digest in zip(payloads, digests, strict=True):
            first.setdefault(digest, payload)
        odds = self._column_odds(column)
        if column in self.claims.memory.marked:  # an earlier task of this process saw the mark
            odds.mark()
        left = self._borrow_known(new, odds, column)
        # while claims go in the log, a batch's cost one request whatever their number: the
        # probe is the task's whole first batch
        probing = self.claims.batched and odds.made < PROBE
        won: list[bytes] = []
        while left:  # a second round once the first showed the column shared
            wanted, skipped = self._worth_claiming(left, first, odds, repeated, probing, column)
            if not wanted:
                break
            theirs = self.claims.claim_many(
                wanted, lambda w: self.packs.places([size for _, size in w])
            )
            for digest, claim in theirs.items():
                odds.shared()  # another task met it first
                self._borrow(digest, claim)
            mine = [d for d, _ in wanted if d not in theirs]
            for stored in self.packs.write_many([first[d] for d in mine], mine):
                self._written[stored.digest] = stored
            won += mine
            self.claimed = self.claimed or bool(mine)
            if theirs:
                self._mark_if_shared(odds, column)
            left = skipped if (theirs and odds.sharing) or len(wanted) == ENTRY_CLAIMS else []
        return won

    def _borrow_known(self, new: list[bytes], odds: SharingOdds, column: str) -> list[bytes]:
        """Borrow those of ``new`` that a claim this process knows of names (no request); the
        others."""
        left = []
        for digest in new:
            claim = self.claims.known(digest)
            if claim is None:
                left.append(digest)
            else:
                odds.shared()
                self._borrow(digest, claim)
        if len(left) < len(new):
            self._mark_if_shared(odds, column)
        return left

    def _worth_claiming(
        self,
        left: list[bytes],
        first: Mapping[bytes, bytes | memoryview],
        odds: SharingOdds,
        repeated: set[bytes],
        probing: bool,
        column: str,
    ) -> tuple[list[tuple[bytes, int]], list[bytes]]:
        """Of ``left``, the (digest, size) worth a claim now (at most an entry's), and the
        others (claims.SharingOdds; ``probing``: all of them)."""
        wanted: list[tuple[bytes, int]] = []
        skipped: list[bytes] = []
        for digest in left:
            size = len(first[digest])
            if len(wanted) < ENTRY_CLAIMS and (
                probing
                or digest in repeated
                or odds.worth(digest, size)
                or (odds.check_due(size) and self.claims.shared(column) and odds.mark())
            ):
                wanted.append((digest, size))
                odds.claimed()
            else:
                skipped.append(digest)
        return wanted, skipped

    def _borrow(self, digest: bytes, claim: Claim) -> None:
        """Reference the place another task of the write claimed for ``digest``."""
        self.borrowed[digest] = StoredPayload(digest, claim.pack, claim.position, claim.size)

    def _write_new(
        self,
        payloads: Sequence[bytes | memoryview],
        digests: Sequence[bytes],
        new: list[bytes],
    ) -> None:
        """Store the payloads whose digests are ``new`` (each once, in the order first met),
        as :meth:`_place` would one by one."""
        if not new:
            return
        first: dict[bytes, bytes | memoryview | None] = dict.fromkeys(new)
        for payload, digest in zip(payloads, digests, strict=True):
            if digest in first and first[digest] is None:
                first[digest] = payload
        for stored in self.packs.write_many(list(first.values()), list(first)):
            self._written[stored.digest] = stored
            self._references[stored.digest] = stored.prepared(self.base_id)

    def _checked(
        self, copies: Mapping[bytes, Sequence[StoredPayload]], sizes: Mapping[bytes, int]
    ) -> dict[bytes, StoredPayload]:
        """The entries of ``copies`` whose bytes are what their key says; a payload without
        one is stored anew (a damaged entry is named in a warning, once per write)."""
        checked = checked_entries(self.packs.table_path, copies, sizes, self.packs.storage_options)
        new = [e for e in checked.damaged if e not in self.damaged]  # warned once per write
        if new and not self.damaged:
            warnings.warn(
                StoreIndexWarning(
                    f"the store index of {self.packs.table_path} names bytes that differ from "
                    f"its entries, or places outside the store (e.g. {new[0].digest.hex()[:16]} "
                    f"at {new[0].pack!r} [{new[0].position}, +{new[0].size})): this write "
                    "stored those payloads anew; `blobhouse verify --deep` lists every damaged "
                    "entry and its rows"
                ),
                stacklevel=4,
            )
        self.damaged.update(new)
        return checked.usable

    def place(self, payload: bytes | memoryview, digest: bytes) -> PreparedBlob:
        """The reference of ``payload`` in the store, writing it only if the store lacks it."""
        return self.place_many([payload], [digest])[0]

    def _mark_if_shared(self, odds: SharingOdds, column: str) -> None:
        """Leave the mark that ``column`` is shared once its odds say so: tasks ahead of this
        one, which saw nothing shared, claim its payloads too (store.claims)."""
        if odds.sharing and not odds.marked:
            self.claims.mark_shared(column)
            odds.mark()

    def _place(self, payload: bytes | memoryview, digest: bytes) -> PreparedBlob:
        stored = self._written.get(digest) or self.borrowed.get(digest)
        if stored is not None and digest in self._unmet:  # met again: shared
            self._column_odds(self._unmet.pop(digest)).shared()
        if stored is None:
            stored = self._found.get(digest)
            if stored is not None:
                self.found_packs.add(stored.pack)
            else:  # not in the index (nor claimed), or in a pack gc is reclaiming: store anew
                stored = self._written[digest] = self.packs.write(payload, digest)
        reference = self._references[digest] = stored.prepared(self.base_id)
        return reference

    def _column_odds(self, column: str) -> SharingOdds:
        """The odds of ``column``: at first those the last task of this process ended with
        (claims.WriteMemory): a worker that learned a column unique, or shared, knows it
        at its next task's first payload, and makes no probe again."""
        odds = self._odds.get(column)
        if odds is None:
            learned = self.claims.memory.odds.get(column) if self.claims else None
            odds = self._odds[column] = replace(learned) if learned else SharingOdds()
        return odds

    def take_new(self) -> tuple[tuple[str, ...], tuple[StoredPayload, ...]]:
        """Packs and payloads stored since the last call, once their bytes are written."""
        self.packs.flush()
        self.queue.drain()
        stored = tuple(self.packs.stored[self._reported :])
        self._reported = len(self.packs.stored)
        return tuple(dict.fromkeys(s.pack for s in stored)), stored

    def finish(self) -> None:
        """Close the open pack and wait for every byte."""
        self.packs.finish()
        self.queue.close()
        if self.claims is not None:  # what the process's next task of the write starts from
            self.claims.memory.odds.update({c: replace(o) for c, o in self._odds.items()})

    def abort(self) -> None:
        """Remove every pack this writer created (its write will not commit); a task that
        claimed payloads finishes its packs instead: other tasks of the write may reference
        them, and the commit checks them (blobhouse.store.claims)."""
        if self.claimed:
            with contextlib.suppress(Exception):
                self.finish()
                return
        self.queue.abandon()
        self.packs.abort_open()
        self.queue.close()
        remove_packs(self.packs.table_path, self.packs.packs, self.packs.storage_options)


class StoreReference:
    """Recognizes resolved references into the table's own store, so a rewrite (compaction)
    keeps them as store references instead of treating them as user-owned external blobs."""

    def __init__(
        self,
        table_path: str,
        base_id: int,
        storage_options: StorageOptions | None = None,
        digests: Mapping[tuple[str, int, int], bytes] | None = None,
    ) -> None:
        self.base_id = base_id
        self.storage_options = storage_options
        self.digests = digests if digests is not None else {}
        # compared in the canonical form: any spelling of a pack's path is recognized
        self.prefix = normalize_uri(store_dir(table_path)) + "/"
        self.found: set[str] = set()  # packs referenced this way: checked before commit
        self._sizes: dict[str, int] = {}
        # rows name a few packs again and again (a compaction carries every row's reference):
        # normalize_uri resolves local links, ~70 us a row
        self._canonical = functools.lru_cache(maxsize=4096)(_canonical_or_none)

    def reference(self, column: LogicalColumn, row: int) -> PreparedBlob | None:
        """The store reference of row ``row`` of ``column`` (whose row holds a uri), or None
        when the uri is not a pack of this table's store. The range must lie inside the pack."""
        if column.position is None:
            return None
        uri = self._canonical(column.uri[row])
        if uri is None or not uri.startswith(f"{self.prefix}{PACKS_DIR}/"):
            return None
        pack = uri.removeprefix(self.prefix)
        if not PACK_NAME.fullmatch(pack):
            raise ExternalBlobError(
                f"blob column {column.column!r}, row {column.first_row + row}: {uri} is not a "
                "pack of the table's store"
            )
        position, size = column.position[row], column.size[row]
        if pack not in self._sizes:
            self._sizes[pack] = object_size(
                uri, column=column.column, row=row, storage_options=self.storage_options
            )
        if position + size > self._sizes[pack]:
            raise ExternalBlobError(
                f"blob column {column.column!r}, row {column.first_row + row}: range "
                f"[{position}, +{size}) is past the end of store pack {pack} "
                f"({self._sizes[pack]} bytes)"
            )
        self.found.add(pack)
        return StoredPayload(b"", pack, position, size).prepared(self.base_id)

    def recorded(self, reference: PreparedBlob) -> bytes | None:
        """The blake3 the rewritten rows recorded for the store payload ``reference`` names
        (None: unknown, e.g. rows Lance rewrote)."""
        return self.digests.get((reference.uri, reference.position, reference.size))


def _canonical_or_none(uri: str) -> str | None:
    """``uri`` in its canonical form, or None when it is no valid uri (not a store reference:
    the external check names the problem)."""
    try:
        return normalize_uri(uri)
    except InvalidInputError:
        return None

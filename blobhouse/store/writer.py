"""Writing into the store: pack writers, the store writer a write stores payloads through (each
distinct payload once, looked up and checked first), and store references."""

from __future__ import annotations

import contextlib
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
from blobhouse.store.claims import (
    Claim,
    Claims,
    SharingOdds,
)
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
        self._next: str | None = None  # the name the next pack gets
        self._size = 0

    def next_place(self, size: int) -> tuple[str, int]:
        """The pack and position the next payload of ``size`` bytes goes to (a new pack past
        the size limit), so that it can be claimed before it is written (nothing is created
        until it is)."""
        if self._file is not None and self._size and self._size + size > self.limit:
            self._close()
        if self._file is not None:
            return self.packs[-1], self._size
        if self._next is None:
            self._next = pack_name(self.name_prefix)
        return self._next, 0

    def write(self, payload: bytes | memoryview, digest: bytes) -> StoredPayload:
        """Append ``payload`` to the current pack (a new one past the size limit)."""
        pack, _ = self.next_place(len(payload))
        if self._file is None:
            uri = f"{self.root}/{pack}"
            self._file = SidecarFile(uri, self.queue, self.storage_options, fresh=True)
            self._files.append(self._file)
            self.packs.append(pack)
            self._next, self._size = None, 0
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
        the store, writing only those the store lacks; the index is asked once for all."""
        written, found, borrowed = self._written, self._found, self.borrowed
        unknown = [
            d
            for d in dict.fromkeys(digests)
            if d not in written and d not in found and d not in borrowed
        ]
        if unknown:
            sizes = {d: len(p) for p, d in zip(payloads, digests, strict=True)}
            self._found.update(self._checked(self.index.find_copies(unknown, self.retired), sizes))
            if self.claims is None:  # no other task to ask: the store lacks them, write them
                self._write_new(payloads, digests, [d for d in unknown if d not in self._found])
        repeated = set()
        if self.claims is not None and len(unknown) < len(digests):
            seen: set[bytes] = set()
            repeated = {d for d in digests if d in seen or seen.add(d)}
        references, claimed = self._references, self._unmet
        return [
            references[d]
            if d in references and d not in claimed
            else self._place(p, d, column, d in repeated)
            for p, d in zip(payloads, digests, strict=True)
        ]

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

    def _place(
        self, payload: bytes | memoryview, digest: bytes, column: str = "", repeated: bool = False
    ) -> PreparedBlob:
        stored = self._written.get(digest) or self.borrowed.get(digest)
        if stored is not None and digest in self._unmet:  # met again: shared
            self._column_odds(self._unmet.pop(digest)).shared()
        if stored is None:
            stored = self._found.get(digest)
            if stored is not None:
                self.found_packs.add(stored.pack)
            elif self._claimed_elsewhere(payload, digest, column, repeated):
                stored = self.borrowed[digest]
            else:  # not in the index, or in a pack gc is reclaiming: store anew
                stored = self._written[digest] = self.packs.write(payload, digest)
        reference = self._references[digest] = stored.prepared(self.base_id)
        return reference

    def _claimed_elsewhere(
        self, payload: bytes | memoryview, digest: bytes, column: str, repeated: bool
    ) -> bool:
        """Whether another task of the write claimed ``digest`` first (then it is borrowed);
        else this one claims it, if worth it, and stores it (blobhouse.store.claims)."""
        claims, size = self.claims, len(payload)
        if claims is None:
            return False
        odds = self._column_odds(column)
        if column in claims.memory.marked:  # an earlier task of this process saw the mark
            odds.marked = True
        if not (repeated or odds.worth(digest, size)):
            if not (odds.check_due(size) and claims.shared(column)):
                return False
            odds.marked = True  # another task found the column shared: claim every payload
        pack, position = self.packs.next_place(size)
        theirs = claims.claim(Claim(digest, pack, position, size, claims.claimant))
        odds.claimed()
        if theirs is None:
            self._unmet[digest] = column
            self.claimed = True
            return False
        odds.shared()  # another task met it first
        if odds.sharing and not odds.marked:  # tasks ahead of this one claim them too
            claims.mark_shared(column)
            odds.marked = True
        self.borrowed[digest] = StoredPayload(digest, theirs.pack, theirs.position, theirs.size)
        return True

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

    def reference(self, column: LogicalColumn, row: int) -> PreparedBlob | None:
        """The store reference of row ``row`` of ``column`` (whose row holds a uri), or None
        when the uri is not a pack of this table's store. The range must lie inside the pack."""
        if column.position is None:
            return None
        try:
            uri = normalize_uri(column.uri[row])
        except InvalidInputError:
            return None  # not a store reference; the external check names the problem
        if not uri.startswith(f"{self.prefix}{PACKS_DIR}/"):
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

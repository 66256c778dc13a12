"""Claims: the tasks of one Spark write store each new payload once between them.

The data source API gives a Spark write no shuffle: every task writes the rows it was handed,
and tasks that meet the same new payload (a video chunk whose frames landed in several
partitions) would each store it in the table's store. Instead, before a task stores payloads
the store's index lacks, it claims their hashes for its write, a batch at a time: it creates
the next entry ``log-<n>`` of the write's claim log (``_blobs/claims/<write id>-claims/``)
exclusively (``O_EXCL`` locally, a conditional PUT on an object store), holding where it is
about to store each payload (pack, position, size), after reading every entry before it and
leaving out what they claimed (:class:`Claims`). The task whose entry names a payload first
stores the bytes; every other task of the write that meets the payload references that place
instead (it *borrows* it), without writing anything. The log holds :data:`LOG_ENTRIES` entries
at most (every worker reads every entry); later claims are objects of their own, named by the
payload's hash.

Why nothing is lost when a task fails (docs/table-properties.md has the whole argument):

- the write commits once, on the driver, with the files of the tasks that succeeded; a pack a
  borrowed reference names must be one of theirs, or be *adopted*: a task that failed after
  claiming finishes the packs it claimed into instead of removing them, and the commit checks
  every borrowed range of such a pack against its hash before it commits. A range that is
  missing or wrong fails the commit (nothing is visible; the write can be run again);
- a retry of a failed task (same partition, a later attempt) takes its predecessor's claims
  over: it stores those payloads itself and claims them again (its claim overrides);
- claims are named per write: another write never sees them; they are removed when the write
  commits or aborts, and gc removes those of writes that died.

An entry is one request whatever it holds, but every worker reads each entry of the others,
and a claim once the log is full is a request of its own. So a task claims a column's payloads
while they turn out shared (:class:`SharingOdds`): its whole first batch (the probe; its first
:data:`PROBE` payloads once the log is full), then as long as at least 1 in
:data:`SHARED_RATIO` of its recent claims was met again (by the task, or claimed first by
another); always one that repeats within the batch that meets it. Otherwise it claims only a
sample of them chosen by hash, so that every task samples the same payloads and notices when
they are shared: a payload of ``size`` bytes with odds ``size /`` :data:`SAMPLE_BYTES` (every
payload of that size or more), about one claim per 32 MiB it stores. A task ahead of the
others would not notice (it claims first, and sees nothing shared): a task that finds a column
shared leaves a mark in the write's claims folder (:meth:`Claims.mark_shared`), and every task
looks for it once per :data:`MARK_CHECK_BYTES` of the column's payloads and then claims all of
them. A column of video chunks or calibration files keeps claiming; one of images unique per
row claims about one in 330 of its 100 KB payloads. What is not claimed may be stored once per
task: the write's index append records such copies, and compaction merges them
(store.duplicates).
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from blobhouse.dedup import content_hash
from blobhouse.errors import StaleWriteError, StoreError
from blobhouse.io.leftovers import make_way, own_folder
from blobhouse.io.objects import (
    StorageOptions,
    is_local,
    object_store,
    put_new,
    read_object,
    remove_folder,
)
from blobhouse.io.uris import as_uri
from blobhouse.layout import (
    CLAIMS_DIR,
    claim_log_entry_name,
    claim_name,
    claims_folder_name,
    shared_column_name,
    store_dir,
)
from blobhouse.placement import MiB
from blobhouse.store.write_memory import WriteMemory, write_memory

#: a task claims the first this many payloads of a column (its whole first batch while the
#: claim log is open: one request whatever it holds) ...
PROBE = 8
#: ... and later ones while at least 1 in this many of its recent claims turned out shared
SHARED_RATIO = 20
#: how many recent claims count (older ones weigh less and less)
RECENT_CLAIMS = 256
#: otherwise a payload of ``size`` bytes is claimed with odds ``size / SAMPLE_BYTES``: about one
#: claim per 32 MiB a task stores (a quarter of its upload parts, io.objects.UPLOAD_PART_BYTES)
SAMPLE_BYTES = 32 * MiB
#: a task that samples a column looks for the mark of its being shared once per this many bytes
#: (one request, as often as a sampled claim)
MARK_CHECK_BYTES = SAMPLE_BYTES
#: claims in one log entry at most (~100 bytes each): a batch with more claims in rounds
ENTRY_CLAIMS = 4096
#: entries in a write's claim log at most: every worker reads every entry of the others, so
#: a big write's later claims are objects of their own (a request each, no reads)
LOG_ENTRIES = 128
_READ_ATTEMPTS = 40  # an entry read empty (being written) is read again for up to ~2 s
_ENTRY_READ_BYTES = 1 << 20  # more than any entry holds: read with one GET, no HEAD first


@dataclass(frozen=True)
class Claimant:
    """Who claims: a Spark task (its partition and attempt), or one process of a write."""

    partition: int
    attempt: int
    id: str

    @classmethod
    def here(cls) -> Claimant:
        """The Spark task running this code, or a process outside Spark."""
        # a Spark task's worker has pyspark loaded already: elsewhere it is not imported
        pyspark = sys.modules.get("pyspark")
        context = pyspark.TaskContext.get() if pyspark is not None else None
        if context is None:
            return cls(-1, 0, uuid.uuid4().hex)
        return cls(context.partitionId(), context.attemptNumber(), uuid.uuid4().hex)

    def succeeds(self, other: Claimant) -> bool:
        """Whether this is a later attempt of ``other``'s task: Spark ran it because that
        one failed, so what ``other`` claimed may never be stored."""
        return (
            self.partition >= 0
            and self.partition == other.partition
            and (self.attempt > other.attempt)
        )


@dataclass(frozen=True)
class Claim:
    """A payload a write's task claimed: ``size`` bytes at ``position`` of ``pack``, whose
    blake3 is ``digest``, stored by ``claimant``."""

    digest: bytes
    pack: str
    position: int
    size: int
    claimant: Claimant


@dataclass
class SharingOdds:
    """How often the payloads one task claimed of one column turned out shared, recent claims
    weighing most; whether the next one is worth a claim.

    >>> odds = SharingOdds()
    >>> [odds.worth(bytes(32), 100_000) for _ in range(PROBE)] == [True] * PROBE  # the probe
    True
    >>> for _ in range(PROBE):
    ...     odds.claimed()  # none met again: unique images
    >>> odds.worth(b"\\xff" * 32, 100_000), odds.worth(bytes(32), 100_000)  # sampled by hash
    (False, True)
    >>> odds.shared(); odds.worth(b"\\xff" * 32, 100_000)  # one in 8 shared: claim them all
    True
    """

    made: int = 0  # claims made
    recent: float = 0.0  # claims made, each older one weighing less (RECENT_CLAIMS)
    recent_shared: float = 0.0  # of those, the ones that turned out shared
    marked: bool = False  # a task of the write found the column shared (Claims.mark_shared)
    unchecked: int = 0  # payload bytes met since the mark was last looked for

    def worth(self, digest: bytes, size: int) -> bool:
        """Whether a payload of ``size`` bytes whose blake3 is ``digest`` is worth a claim."""
        return self.made < PROBE or self.marked or self.sharing or self.sampled(digest, size)

    @staticmethod
    def sampled(digest: bytes, size: int) -> bool:
        """Whether the sample every task claims holds the payload of ``size`` bytes whose
        blake3 is ``digest`` (odds ``size / SAMPLE_BYTES``)."""
        return int.from_bytes(digest[:8], "big") < (size << 64) // SAMPLE_BYTES

    @property
    def sharing(self) -> bool:
        """Whether at least 1 in SHARED_RATIO of the recent claims turned out shared."""
        return self.recent_shared * SHARED_RATIO >= self.recent

    def mark(self) -> bool:
        """A task of the write found the column shared (:meth:`Claims.mark_shared`): every
        payload is worth a claim from now on. True."""
        self.marked = True
        return True

    def check_due(self, size: int) -> bool:
        """Whether to look for the mark now, a payload of ``size`` bytes later."""
        self.unchecked += size
        if self.unchecked < MARK_CHECK_BYTES:
            return False
        self.unchecked = 0
        return True

    def claimed(self) -> None:
        """A claim was made."""
        keep = 1 - 1 / RECENT_CLAIMS
        self.made += 1
        self.recent = self.recent * keep + 1
        self.recent_shared *= keep

    def shared(self) -> None:
        """A claimed payload turned out shared: another task claimed it first, or this one
        met it again."""
        self.recent_shared += 1


class Claims:
    """The claims of one write, as one task makes and reads them: the write's claim log.

    The log is a sequence of entries ``log-<n>`` in the write's claims folder, each created
    exclusively (``O_EXCL`` locally, a conditional PUT on an object store) by the task whose
    claims it holds. A task writes entry ``n`` only after it read every entry before it, and
    leaves out of it what they claimed: so a payload is claimed by exactly one entry, the first
    to name it (but for a later attempt of the same task taking its predecessor's claims over,
    :meth:`Claimant.succeeds`). A refused entry is read, and the task tries the next slot with
    what is left. One entry carries a whole batch's claims: a request per batch, not per
    payload, and a worker reads each entry of another once (:mod:`~blobhouse.store.write_memory`).

    >>> import tempfile
    >>> root = tempfile.mkdtemp()
    >>> mine = Claims(root, "write-1", claimant=Claimant(0, 0, "a"))
    >>> theirs = Claims(root, "write-1", claimant=Claimant(1, 0, "b"))
    >>> digest = content_hash(b"clip")
    >>> mine.claim(Claim(digest, "packs/write-1-a.pack", 0, 4, mine.claimant)) is None
    True
    >>> theirs.claim(Claim(digest, "packs/write-1-b.pack", 0, 4, theirs.claimant)).pack
    'packs/write-1-a.pack'
    """

    def __init__(
        self,
        table_path: str,
        write_id: str,
        storage_options: StorageOptions | None = None,
        claimant: Claimant | None = None,
        memory: WriteMemory | None = None,
    ) -> None:
        self.folder = claims_folder(table_path, write_id)
        self.storage_options = storage_options
        self.claimant = claimant or Claimant.here()
        self.store = object_store(self.folder, storage_options)
        # what earlier tasks of the write in this process claimed or read (Spark reuses workers)
        self.memory = memory or write_memory(self.folder)
        self._root = as_uri(table_path.rstrip("/"))
        self._owned = False  # whether the claims' folder was found a folder (own_folder)

    def claim(self, claim: Claim) -> Claim | None:
        """Claim ``claim.digest`` for ``claim``'s place: None if this task now stores the
        payload there, else the claim another task of the write made first (reference its
        place). A claim of an earlier attempt of this task is taken over."""
        theirs = self.claim_many(
            [(claim.digest, claim.size)], lambda _: [(claim.pack, claim.position)]
        )
        return theirs.get(claim.digest)

    def claim_many(
        self,
        wanted: Sequence[tuple[bytes, int]],
        places: Callable[[list[tuple[bytes, int]]], list[tuple[str, int]]],
    ) -> dict[bytes, Claim]:
        """Claim each ``(digest, size)`` of ``wanted`` in one log entry (a task stores at most
        :data:`ENTRY_CLAIMS` payloads per call): the claims another task of the write made
        first, by digest; this task stores the rest, in order, at the places ``places`` gives
        them (called again with what is left whenever an entry of another task took some)."""
        if len(wanted) > ENTRY_CLAIMS:
            raise ValueError(f"at most {ENTRY_CLAIMS} claims per entry, not {len(wanted)}")
        if not self._owned:  # a link there would put claims in (and gc sweep) a user's folder
            own_folder(self.store, self._root, self.folder.removeprefix(self._root + "/"))
            self._owned = True
        theirs: dict[bytes, Claim] = {}
        pending = list(wanted)
        with self.memory.log_lock:
            while True:
                pending = [(d, size) for d, size in pending if not self._taken(d, theirs)]
                if not pending:
                    return theirs
                if not self.batched:  # the log is full: one object per claim
                    self._claim_each(pending, places, theirs)
                    return theirs
                mine = [
                    Claim(digest, pack, position, size, self.claimant)
                    for (digest, size), (pack, position) in zip(
                        pending, places(pending), strict=True
                    )
                ]
                if self._append(self.memory.log_next, encode_entry(mine)):
                    self.memory.log_next += 1
                    for claim in mine:
                        self.memory.remember(claim)
                    return theirs
                self._apply(self._read_entry(self.memory.log_next))
                self.memory.log_next += 1

    @property
    def batched(self) -> bool:
        """Whether claims still go in the log (a batch's in one request): until it holds
        :data:`LOG_ENTRIES` entries, and so each worker reads at most that many."""
        return self.memory.log_next < LOG_ENTRIES

    def _claim_each(
        self,
        pending: list[tuple[bytes, int]],
        places: Callable[[list[tuple[bytes, int]]], list[tuple[str, int]]],
        theirs: dict[bytes, Claim],
    ) -> None:
        """Claim each of ``pending`` with an object of its own, named by its hash (once the
        log is full: whoever claims so has read every entry of it, and no entry comes after).
        The places of those this task wins are consecutive, as ``places`` gives them."""
        won: list[tuple[bytes, int]] = []
        rest, planned = pending, places(pending)
        while rest:
            (digest, size), (pack, position) = rest[0], planned[0]
            found = self._claim_object(Claim(digest, pack, position, size, self.claimant))
            if found is None:
                won.append(rest[0])
                rest, planned = rest[1:], planned[1:]
                continue
            theirs[digest] = found
            rest = rest[1:]
            planned = places(won + rest)[len(won) :]  # the next ones move up

    def _claim_object(self, claim: Claim) -> Claim | None:
        """Claim ``claim.digest`` with an object of its own: None if this task stores the
        payload, else the claim another task made first."""
        uri, entry = self._claim_uri(claim.digest), encode_entry([claim])
        if self._append_at(uri, entry):
            self.memory.remember(claim)
            return None
        found = self._read_at(uri)
        if not found or self.claimant.succeeds(found[0].claimant):
            # the claimant died while writing its claim, or before storing the payload:
            # nobody could borrow an unreadable claim; a predecessor's borrowers are checked
            # at the commit
            self.store.put(uri, entry)
            self.memory.remember(claim)
            return None
        self.memory.remember(found[0])
        return found[0]

    def known(self, digest: bytes) -> Claim | None:
        """The claim another task made of ``digest`` that this process knows already (one of
        its tasks made it, or it read it): no request. An earlier attempt's is taken over."""
        known = self.memory.claim_of(digest)
        if known is None or known.claimant == self.claimant:
            return None
        if self.claimant.succeeds(known.claimant):
            return None
        return known

    def _taken(self, digest: bytes, theirs: dict[bytes, Claim]) -> bool:
        """Whether another task claimed ``digest`` (kept in ``theirs``), as :meth:`known`."""
        known = self.known(digest)
        if known is not None:
            theirs[digest] = known
        return known is not None

    def _append(self, at: int, entry: bytes) -> bool:
        """Create entry ``at`` holding ``entry``; False if it exists (another task's)."""
        return self._append_at(self._entry_uri(at), entry)

    def _append_at(self, uri: str, entry: bytes) -> bool:
        """Create the object at ``uri`` holding ``entry``; False if it exists."""
        if put_new(self.store, uri, entry):
            return True
        # locally, a directory or a link there is never a task's entry: cleared, then tried
        # again (an object store has neither: a refused PUT is another task's entry)
        if is_local(uri):
            make_way(self.store, uri)
            return put_new(self.store, uri, entry)
        return False

    def _apply(self, entry: list[Claim]) -> None:
        """Keep the claims of another task's ``entry``: the first claim of a payload stands,
        but for a later attempt of its claimant's task, which takes it over."""
        for claim in entry:
            known = self.memory.claim_of(claim.digest)
            if known is None or claim.claimant.succeeds(known.claimant):
                self.memory.remember(claim)

    def _read_entry(self, at: int) -> list[Claim]:
        """The claims of entry ``at``; none if it stays unreadable (its writer died writing
        it, and so stores nothing it named: whatever it claimed is claimed again)."""
        return self._read_at(self._entry_uri(at))

    def _read_at(self, uri: str) -> list[Claim]:
        """The claims of the entry or claim object at ``uri`` (none: unreadable)."""
        delay = 0.001
        for _ in range(_READ_ATTEMPTS):
            try:
                return decode_entry(read_object(uri, self.storage_options, size=_ENTRY_READ_BYTES))
            except (ValueError, FileNotFoundError):  # being written
                time.sleep(delay)
                delay = min(delay * 2, 0.1)
        return []

    def claimed(self, digest: bytes) -> Claim | None:
        """The claim of ``digest`` that stands in the log now, read from its start (what a
        task that has read nothing would find)."""
        found, at = None, 0
        while self.store.size(self._entry_uri(at)) is not None:
            for claim in self._read_entry(at):
                if claim.digest == digest and (
                    found is None or claim.claimant.succeeds(found.claimant)
                ):
                    found = claim
            at += 1
        own = self._read_at(self._claim_uri(digest)) if at >= LOG_ENTRIES else []
        return own[0] if own else found

    def mark_shared(self, column: str) -> None:
        """Leave the mark that ``column``'s payloads are shared between the write's tasks
        (best effort: a task that cannot leave it claims on itself)."""
        self.memory.marked.add(column)
        with contextlib.suppress(OSError, StoreError):
            put_new(self.store, self._mark_uri(column), b"")

    def shared(self, column: str) -> bool:
        """Whether a task of the write left the mark that ``column``'s payloads are shared."""
        if column in self.memory.marked:
            return True
        try:
            marked = self.store.size(self._mark_uri(column)) is not None
        except (OSError, StoreError):
            return False
        if marked:
            self.memory.marked.add(column)
        return marked

    def _mark_uri(self, column: str) -> str:
        return f"{self.folder}/{shared_column_name(column)}"

    def _entry_uri(self, at: int) -> str:
        return f"{self.folder}/{claim_log_entry_name(at)}"

    def _claim_uri(self, digest: bytes) -> str:
        return f"{self.folder}/{claim_name(digest)}"


def encode_entry(claims: Sequence[Claim]) -> bytes:
    """One task's log entry holding ``claims`` (all of the same claimant), as JSON: the packs
    named once, each claim as ``[digest hex, pack number, position, size]``.

    >>> claimant = Claimant(2, 0, "t")
    >>> entry = encode_entry([Claim(bytes(32), "packs/p.pack", 7, 3, claimant)])
    >>> decode_entry(entry) == [Claim(bytes(32), "packs/p.pack", 7, 3, claimant)]
    True
    """
    c = claims[0].claimant
    packs = list(dict.fromkeys(claim.pack for claim in claims))
    number = {pack: n for n, pack in enumerate(packs)}
    return json.dumps(
        {
            "task": [c.partition, c.attempt, c.id],
            "pack_names": packs,
            "claimed": [[x.digest.hex(), number[x.pack], x.position, x.size] for x in claims],
        },
        separators=(",", ":"),
    ).encode()


def decode_entry(raw: bytes) -> list[Claim]:
    """The claims of a log entry (:func:`encode_entry`); ValueError when it is not one (being
    written, or damaged).

    >>> decode_entry(b'{"task": [1, 0, "t"], "pack_names": [], "claimed": [["00", 3, 0, 1]]}')
    Traceback (most recent call last):
    ValueError: not a claim log entry: list index out of range
    """
    try:
        record = json.loads(raw)
        partition, attempt, claimant_id = record["task"]
        claimant = Claimant(int(partition), int(attempt), str(claimant_id))
        packs = record["pack_names"]
        return [
            Claim(bytes.fromhex(digest), str(packs[pack]), int(position), int(size), claimant)
            for digest, pack, position, size in record["claimed"]
        ]
    except (KeyError, TypeError, IndexError, AttributeError, ValueError) as exc:
        raise ValueError(f"not a claim log entry: {exc}") from None


def claims_folder(table_path: str, write_id: str) -> str:
    """Where the claims of write ``write_id`` live: named with the write's prefix, so that gc
    keeps them while the write's lease lives and sweeps those of a write that died."""
    return as_uri(f"{store_dir(table_path)}/{CLAIMS_DIR}/{claims_folder_name(write_id)}")


def remove_claims(
    table_path: str, write_id: str, storage_options: StorageOptions | None = None
) -> None:
    """Remove the claims of a write that committed or aborted (best effort: gc removes what
    is left)."""
    remove_folder(claims_folder(table_path, write_id), storage_options)


def adopt(table_path: str, borrowed: list, storage_options: StorageOptions | None = None) -> None:
    """Check the payloads borrowed from packs no succeeding task of the write produced (a task
    that failed after claiming them finished those packs): each range must hash to its
    digest. :class:`StaleWriteError` if one is missing or wrong: the write cannot commit."""
    root = store_dir(table_path)
    for payload in borrowed:
        uri = as_uri(f"{root}/{payload.pack}")
        store = object_store(uri, storage_options)
        try:
            size = store.size(uri)
            if size is None or payload.position + payload.size > size:
                raise FileNotFoundError(uri)
            source = store.open(uri)
            try:
                data = source.read(payload.position, payload.size)
            finally:
                source.close()
        except OSError:
            data = None
        if data is None or content_hash(data) != payload.digest:
            raise StaleWriteError(
                f"a task of this write failed after claiming a payload other tasks reference "
                f"({payload.pack} at {payload.position}, {payload.size} bytes) and before "
                "storing it; nothing was committed, run the write again"
            )

"""Claims: the tasks of one Spark write store each new payload once between them.

The data source API gives a Spark write no shuffle: every task writes the rows it was handed,
and tasks that meet the same new payload (a video chunk whose frames landed in several
partitions) would each store it in the table's store. Instead, before a task stores a payload
the store's index lacks, it claims the payload's hash for its write: it creates
``_blobs/claims/<write id>-claims/<blake3 hex>`` exclusively (``O_EXCL`` locally, a conditional PUT
on an object store), holding where it is about to store the payload (pack, position, size).
The task that creates the claim stores the bytes; every other task of the write that meets the
payload references that place instead (it *borrows* it), without writing anything.

Why nothing is lost when a task fails (docs/table-properties.md has the whole argument):

- the write commits once, on the driver, with the files of the tasks that succeeded; a pack a
  borrowed reference names must be one of theirs, or be *adopted*: a task that failed after
  claiming finishes the packs it claimed into instead of removing them, and the commit checks
  every borrowed range of such a pack against its hash before it commits. A range that is
  missing or wrong fails the commit (nothing is visible; the write can be run again);
- a retry of a failed task (same partition, a later attempt) takes its predecessor's claims
  over: it stores those payloads itself and points the claims at its own copy;
- claims are named per write: another write never sees them; they are removed when the write
  commits or aborts, and gc removes those of writes that died.

A payload up to :data:`CLAIM_MIN_BYTES` costs about as much to claim (one small object) as to
store twice, so a task claims small payloads of a column only while they turn out shared: its
first :data:`SMALL_PROBE` of them, then as long as at least 1 in :data:`SMALL_SHARED_RATIO`
was met again (by the task, or claimed first by another), and always one that repeats within
the batch that meets it. A column of calibration files keeps claiming; one of thumbnails
unique per row stops after the probe. What is not claimed may be stored once per task: the
write's index append records such copies, and compaction merges them (store.duplicates).
"""

from __future__ import annotations

import json
import sys
import time
import uuid
from dataclasses import dataclass

from blobhouse.dedup import content_hash
from blobhouse.errors import StaleWriteError
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
from blobhouse.layout import CLAIMS_DIR, claims_folder_name, store_dir
from blobhouse.placement import KiB

#: payloads above this size are always claimed; smaller ones while their column's are shared
CLAIM_MIN_BYTES = 64 * KiB
#: a task claims the first this many small payloads of a column ...
SMALL_PROBE = 256
#: ... and later ones while at least 1 in this many of them turned out shared
SMALL_SHARED_RATIO = 20
_READ_ATTEMPTS = 40  # a claim read empty (being written) is read again for up to ~2 s


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

    def encode(self) -> bytes:
        c = self.claimant
        return json.dumps(
            {
                "pack": self.pack,
                "position": self.position,
                "size": self.size,
                "task": [c.partition, c.attempt, c.id],
            }
        ).encode()

    @classmethod
    def decode(cls, digest: bytes, raw: bytes) -> Claim:
        record = json.loads(raw)
        partition, attempt, claimant_id = record["task"]
        return cls(
            digest,
            record["pack"],
            int(record["position"]),
            int(record["size"]),
            Claimant(int(partition), int(attempt), str(claimant_id)),
        )


class Claims:
    """The claims of one write, as one task makes and reads them.

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
    ) -> None:
        self.folder = claims_folder(table_path, write_id)
        self.storage_options = storage_options
        self.claimant = claimant or Claimant.here()
        self.store = object_store(self.folder, storage_options)
        self._root = as_uri(table_path.rstrip("/"))
        self._owned = False  # whether the claims' folder was found a folder (own_folder)

    def claim(self, claim: Claim) -> Claim | None:
        """Claim ``claim.digest`` for ``claim``'s place: None if this task now stores the
        payload there, else the claim another task of the write made first (reference its
        place). A claim of an earlier attempt of this task is taken over."""
        uri = self._uri(claim.digest)
        if not self._owned:  # a link there would put claims in (and gc sweep) a user's folder
            own_folder(self.store, self._root, self.folder.removeprefix(self._root + "/"))
            self._owned = True
        if put_new(self.store, uri, claim.encode()):
            return None
        # locally, a directory or a link there is never a task's claim: cleared, then tried
        # again (an object store has neither: a refused PUT is another task's claim)
        if is_local(uri):
            make_way(self.store, uri)
            if put_new(self.store, uri, claim.encode()):
                return None
        found = self._read(uri, claim.digest)
        if found is None or self.claimant.succeeds(found.claimant):
            # the claimant died while writing its claim, or before storing the payload:
            # nobody could borrow an unreadable claim; a predecessor's borrowers are checked
            # at the commit
            self.store.put(uri, claim.encode())
            return None
        return found

    def _read(self, uri: str, digest: bytes) -> Claim | None:
        """The claim at ``uri``; None if it stays unreadable (its writer died writing it)."""
        delay = 0.001
        for _ in range(_READ_ATTEMPTS):
            try:
                return Claim.decode(digest, read_object(uri, self.storage_options))
            except (ValueError, KeyError, FileNotFoundError):  # created, not written yet
                time.sleep(delay)
                delay = min(delay * 2, 0.1)
        return None

    def _uri(self, digest: bytes) -> str:
        return f"{self.folder}/{digest.hex()}"


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

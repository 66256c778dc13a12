"""What the tasks of one write learn once per process: Spark runs task after task of a write in
the same Python worker (it reuses its workers), and each task used to open the store's index,
list its tombstones, and claim or read the claims of payloads an earlier task of the worker had
already met: requests per task that the process already had the answer to.

Everything kept is what a request would answer again, or an older answer that a task starting
earlier would have used anyway:

- a claim never changes once made, but for a later attempt of the same task taking it over
  (:meth:`blobhouse.store.claims.Claimant.succeeds`): such a claim is asked again; the claim
  log's entries never change either, so each is read once per process (the next one to read
  is kept);
- a column marked shared stays marked for the write;
- how often a column's claims turned out shared (:class:`~blobhouse.store.claims.SharingOdds`)
  is what a task learned of the write's payloads: the next task of the process starts from
  it, not from a probe of its own;
- the index's version and the retired packs are those a task of the process read at most
  :data:`FRESH_SECONDS` ago: an entry added since is one a task starting then would not have
  found either (lower dedup, never a wrong reference: the commit checks the packs a task found
  against the tombstones of its moment, and a pack retired meanwhile fails the write, so the
  answers are not kept for long).

Memory is bounded: the claims of the latest :data:`KEPT_CLAIMS` payloads, of the latest
:data:`KEPT_WRITES` writes.

>>> memory = write_memory("file:///t/_blobs/claims/write-1-claims")
>>> memory is write_memory("file:///t/_blobs/claims/write-1-claims")
True
>>> memory.marked.add("clip"); "clip" in write_memory("file:///t/_blobs/claims/write-1-claims").marked
True
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

#: claims kept per write (about 200 bytes each: 20 MB at most)
KEPT_CLAIMS = 100_000
#: how long the index and the retired packs a task read serve the later tasks
FRESH_SECONDS = 30.0
#: writes whose memory is kept (a worker serves one write at a time; two overlap at most)
KEPT_WRITES = 2


@dataclass
class WriteMemory:
    """What the tasks of one write in this process learned: claims made or read, columns
    marked shared, the odds of sharing the last one ended with, the store index they opened and
    the packs gc retired."""

    # digest -> its Claim, and column -> SharingOdds (blobhouse.store.claims, which uses this
    # module: typed loosely here, never a circle)
    claims: OrderedDict[bytes, Any] = field(default_factory=OrderedDict)
    marked: set[str] = field(default_factory=set)
    odds: dict[str, Any] = field(default_factory=dict)  # as the last task ended
    index: Any = None  # the LanceDataset of the index (None: nothing stored yet)
    retired: frozenset[str] | None = None
    read_at: float = 0.0  # when the index and the retired packs were read (time.monotonic)
    log_next: int = 0  # the claim log's first entry no task of this process wrote or read
    lock: threading.Lock = field(default_factory=threading.Lock)
    log_lock: threading.Lock = field(default_factory=threading.Lock)  # held to use the log

    def claim_of(self, digest: bytes) -> Any:
        """The claim of ``digest`` a task of this process made or read, if kept."""
        return self.claims.get(digest)

    def remember(self, claim: Any) -> None:
        """Keep ``claim`` (made or read) for the later tasks of this process."""
        with self.lock:
            self.claims[claim.digest] = claim
            self.claims.move_to_end(claim.digest)
            while len(self.claims) > KEPT_CLAIMS:
                self.claims.popitem(last=False)

    def store_state(
        self, read: Callable[[], tuple[Any, frozenset[str]]]
    ) -> tuple[Any, frozenset[str]]:
        """The store index and the retired packs a task read lately, else ``read()`` now."""
        with self.lock:
            if self.retired is None or time.monotonic() - self.read_at > FRESH_SECONDS:
                self.index, self.retired = read()
                self.read_at = time.monotonic()
            return self.index, self.retired


_MEMORIES: OrderedDict[str, WriteMemory] = OrderedDict()
_MEMORIES_LOCK = threading.Lock()


def write_memory(write: str) -> WriteMemory:
    """The memory of write ``write`` (its claims' folder: unique per write and table) in this
    process, made on first use."""
    with _MEMORIES_LOCK:
        memory = _MEMORIES.get(write)
        if memory is None:
            memory = _MEMORIES[write] = WriteMemory()
            while len(_MEMORIES) > KEPT_WRITES:
                _MEMORIES.popitem(last=False)
        _MEMORIES.move_to_end(write)
        return memory

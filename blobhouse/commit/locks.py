"""Short-lived exclusive locks on a table, for a step that must not interleave with the same
step of another writer (another thread, process or machine).

Lance's optimistic commits cannot serialize every step blobhouse needs: a merge that inserts
keys must check that no concurrent merge inserted the same keys *and* commit, with nobody
committing in between, and Lance rebases one append over another silently. So such a step runs
under a lock: ``_leases/locks/<name>``, created exclusively (``O_EXCL`` locally, a conditional
PUT on S3: :meth:`~blobhouse.storage.ObjectStore.create`), holding a random token.

- a waiter retries the create with backoff (jittered, up to :data:`MAX_DELAY_SECONDS` apart);
- the holder touches the lock every :data:`~blobhouse.commit.leases.REFRESH_SECONDS`; a lock nobody
  touched for :data:`EXPIRY_SECONDS` (its holder was killed) is broken by a waiter, so a dead
  holder blocks the others for that long at most. Breaking is itself exclusive (a marker
  named after the lock's token, created exclusively) and deletes the lock only if its token
  and modification time are still those found stale: two waiters never break a live holder's
  lock;
- a holder removes its lock when the step ends (only its own: it checks the token).

A holder stalled for longer than the expiry (a frozen VM) may find its lock broken; the step it
guards is short (a check and a commit), so this is the accepted limit. On the stores pyarrow
reaches (``gs://``, ``az://``) creating an object is not atomic: there the lock is best effort.
Locks live under ``_leases/`` with a ``/`` in their name: leases ignore them, and gc does not
sweep them.
"""

from __future__ import annotations

import contextlib
import random
import time
import uuid
from collections.abc import Iterator

from blobhouse.commit.leases import LEASES_DIR, TIMEOUT_SECONDS, touching
from blobhouse.storage import ObjectInfo, ObjectStore, StorageOptions, object_store, put_new
from blobhouse.uris import as_uri

LOCKS_DIR = f"{LEASES_DIR}/locks"
#: a lock untouched for this long belongs to a holder that died: waiters break it (a holder
#: touches it every :data:`~blobhouse.commit.leases.REFRESH_SECONDS`, as a write its lease)
EXPIRY_SECONDS = TIMEOUT_SECONDS
#: the longest pause between two attempts of a waiter
MAX_DELAY_SECONDS = 0.2
#: how long a waiter waits before it gives up (:class:`LockTimeoutError`)
WAIT_SECONDS = 4 * EXPIRY_SECONDS
_BREAK = ".break-"


class LockTimeoutError(TimeoutError):
    """A lock stayed held (by a live holder) for longer than a waiter waits."""


def lock_uri(table_path: str, name: str) -> str:
    """Where the lock ``name`` of the table at ``table_path`` lives.

    >>> lock_uri("/data/t", "upsert.feature/x")
    'file:///data/t/_leases/locks/upsert.feature~x'
    """
    # one object, not a folder: '/' (in a branch's name) becomes '~', which names never hold
    return as_uri(f"{table_path.rstrip('/')}/{LOCKS_DIR}/{name.replace('/', '~')}")


@contextlib.contextmanager
def held(
    uri: str, storage_options: StorageOptions | None = None, *, wait: float = WAIT_SECONDS
) -> Iterator[None]:
    """Hold the lock at ``uri`` while the block runs: wait for its holder to release it (or to
    expire: :data:`EXPIRY_SECONDS`), for ``wait`` seconds at most (:class:`LockTimeoutError`).

    >>> import tempfile
    >>> uri = lock_uri(tempfile.mkdtemp(), "example")
    >>> with held(uri):
    ...     holder(uri) is not None
    True
    >>> holder(uri) is None
    True
    """
    store = object_store(uri, storage_options)
    token = uuid.uuid4().hex
    deadline = time.monotonic() + wait
    delay = 0.002
    while not put_new(store, uri, token.encode()):
        _break_if_expired(store, uri)
        if time.monotonic() > deadline:
            raise LockTimeoutError(f"the lock {uri} stayed held for {wait:.0f} s")
        # jittered: waiters that met at the lock do not retry in lockstep
        time.sleep(delay * random.uniform(0.5, 1.5))
        delay = min(delay * 2, MAX_DELAY_SECONDS)

    def refresh() -> None:
        if _read_token(store, uri) == token:  # a waiter broke it (we stalled): not ours now
            store.put(uri, token.encode())

    try:
        with touching(refresh, "blobhouse-lock"):
            yield
    finally:
        with contextlib.suppress(OSError):  # left behind, it expires
            if _read_token(store, uri) == token:
                store.delete(uri)


def holder(uri: str, storage_options: StorageOptions | None = None) -> str | None:
    """The token of the lock's holder ('' while it is being written); None: not held."""
    return _read_token(object_store(uri, storage_options), uri)


def _info(store: ObjectStore, uri: str) -> ObjectInfo | None:
    """The listing entry of the object at ``uri`` (its modification time by the store's
    clock); listing its folder works on every store."""
    folder, name = uri.rsplit("/", 1)
    return next((i for i in store.list(folder) if i.name == name), None)


def _break_if_expired(store: ObjectStore, uri: str) -> None:
    """Delete the lock at ``uri`` if nobody touched it for :data:`EXPIRY_SECONDS`."""
    found = _info(store, uri)
    if found is None or store.now(uri) - found.mtime < EXPIRY_SECONDS:
        return
    token = _read_token(store, uri)
    if token is None:
        return
    # the marker names the stale lock (its token, or its time if it is empty): only one
    # waiter breaks it, and a later lock is a different one
    marker = f"{uri}{_BREAK}{token or int(found.mtime * 1e6)}"
    if not put_new(store, marker, b""):
        stale = _info(store, marker)
        if stale is not None and store.now(uri) - stale.mtime >= EXPIRY_SECONDS:
            store.delete(marker)  # its breaker died while breaking
        return
    try:
        again = _info(store, uri)
        if again is not None and again.mtime == found.mtime and _read_token(store, uri) == token:
            store.delete(uri)
    finally:
        store.delete(marker)


def _read_token(store: ObjectStore, uri: str) -> str | None:
    size = store.size(uri)
    if not size:
        return None if size is None else ""
    try:
        source = store.open(uri)
        try:
            return source.read(0, size).decode(errors="replace")
        finally:
            source.close()
    except FileNotFoundError:  # released meanwhile
        return None

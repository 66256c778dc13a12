"""Short-lived exclusive locks on a table, for a step that must not interleave with the same
step of another writer (another thread, process or machine).

Lance's optimistic commits cannot serialize every step blobhouse needs: a merge that inserts
keys must check that no concurrent merge inserted the same keys *and* commit, with nobody
committing in between, and Lance rebases one append over another silently. So such a step runs
under a lock: ``_leases/locks/<name>``, created exclusively (``O_EXCL`` locally, a conditional
PUT on S3: :meth:`~blobhouse.io.objects.ObjectStore.create`), holding a random token.

- a waiter retries the create with backoff (jittered, up to :data:`MAX_DELAY_SECONDS` apart);
- the holder touches the lock every :data:`~blobhouse.commit.leases.REFRESH_SECONDS`; a lock nobody
  touched for :data:`EXPIRY_SECONDS` (its holder was killed) is broken by a waiter, so a dead
  holder blocks the others for that long at most. What no live holder leaves at the lock's
  path -- a directory, a symbolic link, garbage instead of a token, a file still empty
  :data:`~blobhouse.io.leftovers.EMPTY_SECONDS` after its create -- is broken at once
  (:mod:`blobhouse.io.leftovers`), or named with the command that clears it when it cannot be
  removed. Breaking is itself exclusive (a marker named after what was found, created
  exclusively) and deletes the lock only if it is still what was found stale: two waiters
  never break a live holder's lock;
- a holder removes its lock when the step ends (only its own: it checks the token).

A holder stalled for longer than the expiry (a frozen VM) may find its lock broken; the step it
guards is short (a check and a commit), so this is the accepted limit. On the stores pyarrow
reaches (``gs://``, ``az://``) creating an object is not atomic: there the lock is best effort.
Locks live under ``_leases/`` with a ``/`` in their name: leases ignore them; gc removes the
stale ones (:func:`stale_locks`).
"""

from __future__ import annotations

import contextlib
import random
import re
import time
import uuid
from collections.abc import Iterator

from blobhouse.commit.leases import TIMEOUT_SECONDS, touching
from blobhouse.io.leftovers import (
    BREAK,
    EMPTY_SECONDS,
    Found,
    clear_once,
    found_at,
    listed,
    own_folder,
)
from blobhouse.io.objects import ObjectStore, StorageOptions, object_store, put_new
from blobhouse.io.uris import as_uri
from blobhouse.layout import LOCKS_DIR

#: a lock untouched for this long belongs to a holder that died: waiters break it (a holder
#: touches it every :data:`~blobhouse.commit.leases.REFRESH_SECONDS`, as a write its lease)
EXPIRY_SECONDS = TIMEOUT_SECONDS
#: the longest pause between two attempts of a waiter
MAX_DELAY_SECONDS = 0.2
#: how long a waiter waits before it gives up (:class:`LockTimeoutError`)
WAIT_SECONDS = 4 * EXPIRY_SECONDS
_TOKEN = re.compile(rb"[0-9a-f]{32}")  # what a holder writes in its lock (uuid4().hex)


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
    folder = uri.rsplit("/", 1)[0]
    if folder.endswith(f"/{LOCKS_DIR}"):  # a table's lock: its folder never a link's target
        own_folder(store, folder.removesuffix(f"/{LOCKS_DIR}"), LOCKS_DIR)
    token = uuid.uuid4().hex
    deadline = time.monotonic() + wait
    delay = 0.002
    while not put_new(store, uri, token.encode()):
        _break_if_stale(store, uri)
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


def _break_if_stale(store: ObjectStore, uri: str) -> None:
    """Delete what stands at the lock's ``uri`` if no live holder's lock is there (see
    :func:`is_stale`)."""
    found = found_at(store, uri)
    if found is not None and is_stale(store, uri, found):
        clear_once(store, uri, found)


def is_stale(store: ObjectStore, uri: str, found: Found) -> bool:
    """Whether ``found`` at a lock's ``uri`` is no live holder's: not a file (a directory, a
    link), a file still empty :data:`EMPTY_SECONDS` after it was made, one holding no token,
    or a token nobody touched for :data:`EXPIRY_SECONDS`."""
    if not found.is_object:
        return True
    if not found.body:
        return found.age(store, uri) >= EMPTY_SECONDS
    return _TOKEN.fullmatch(found.body) is None or found.age(store, uri) >= EXPIRY_SECONDS


def stale_locks(
    table_path: str, storage_options: StorageOptions | None = None
) -> list[tuple[str, Found]]:
    """The table's locks no live holder holds (what gc removes), and markers of breakers that
    died; each with what stands there."""
    folder = as_uri(f"{table_path.rstrip('/')}/{LOCKS_DIR}")
    store = object_store(folder, storage_options)
    stale = []
    for name in listed(store, folder):
        uri = f"{folder}/{name}"
        found = found_at(store, uri)
        if found is None:
            continue
        if BREAK in name:  # a breaker's marker: its breaker died if it is this old
            if found.age(store, uri) >= EXPIRY_SECONDS:
                stale.append((uri, found))
        elif is_stale(store, uri, found):
            stale.append((uri, found))
    return stale


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

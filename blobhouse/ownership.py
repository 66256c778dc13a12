"""One owner per managed object: an owner marker next to the object names the one table that
may delete it (docs/managed-objects.md).

For a managed object at ``<dir>/<name>`` the marker is ``<dir>/.blobhouse-owner/<name>.json``
(``{"format": 1, "table": <owner's root uri>, "created": <epoch seconds>}``), made with an
exclusive create (``O_EXCL`` locally, a conditional PUT on S3): of two tables handing the same
object over, one creates it and the other is refused (:class:`ManagedObjectOwnedError`).
A write creates the markers of the objects it hands over right before its Lance commit
(:func:`claim`; it is refused if one names another table) and removes those it created if it
does not commit (:func:`release`); gc
deletes an object only when its marker names the table, claiming first an object that has
none (registered before markers existed).

Branches share the table's root, so they share ownership; a copied or moved table has another
root, so the original's markers are not its own.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from blobhouse.errors import ExternalBlobError, ManagedObjectOwnedError, cleanup_after
from blobhouse.io.leftovers import (
    EMPTY_SECONDS,
    Found,
    clear_command,
    clear_once,
    found_at,
    own_folder,
)
from blobhouse.io.objects import (
    NAME_MAX,
    ObjectStore,
    StorageOptions,
    each_uri,
    long_name,
    object_store,
    put_new,
    read_object,
)
from blobhouse.layout import OWNER_DIR, TableLocation, owner_marker, same_location

OWNER_FORMAT = 1
_READ_ATTEMPTS = 12  # a marker read empty (being written) is read again for up to ~0.5 s
T = TypeVar("T")


def marker_problem(uri: str) -> str | None:
    """Why the managed object at ``uri`` can have no owner marker (its name plus ``.json`` is
    too long a local file name), or None.

    >>> marker_problem("/media/" + "b" * 252)  # doctest: +ELLIPSIS
    'its owner marker would be named bbbb...b.json, 257 bytes long; ... reference it unmanaged'
    """
    if long_name(owner_marker(uri)) is None:
        return None
    name = owner_marker(uri).rsplit("/", 1)[1]
    return (
        f"its owner marker would be named {name[:4]}...{name[-6:]}, {len(os.fsencode(name))} "
        f"bytes long; a local file name holds at most {NAME_MAX} bytes: rename the object "
        f"({NAME_MAX - len('.json')} bytes at most) or reference it unmanaged"
    )


@dataclass(frozen=True)
class Owner:
    """What an object's owner marker says: ``table`` is the owner's root uri (None: no marker),
    ``readable`` False when a marker exists but cannot be read or parsed."""

    table: str | None
    readable: bool = True

    def is_table(self, location: TableLocation) -> bool:
        """Whether the marker names the table at ``location`` (any of its branches).

        >>> Owner("file:///data/t").is_table(TableLocation("/data/t"))
        True
        >>> Owner(None).is_table(TableLocation("/data/t"))
        False
        """
        return self.table is not None and same_location(self.table, location.root_uri)

    def describe(self) -> str:
        """The owner as an error or a report names it.

        >>> Owner("s3://b/train").describe(), Owner(None, readable=False).describe()
        ('table s3://b/train', 'an unreadable owner marker')
        """
        return f"table {self.table}" if self.readable else "an unreadable owner marker"


def read_owner(uri: str, storage_options: StorageOptions | None = None) -> Owner:
    """The owner of the managed object at ``uri``, from its marker.

    >>> import tempfile
    >>> read_owner(f"file://{tempfile.mkdtemp()}/clip.mp4")
    Owner(table=None, readable=True)
    """
    marker = owner_marker(uri)
    delay = 0.005
    for attempt in range(_READ_ATTEMPTS):
        try:
            body = read_object(marker, storage_options)
        except FileNotFoundError:
            return Owner(None)
        except OSError:
            break
        owner = _parsed(body)
        if owner is not None:
            return Owner(owner)
        # locally a marker exists, empty, between its O_EXCL create and its write
        if body or attempt == _READ_ATTEMPTS - 1:
            break
        time.sleep(delay)
        delay = min(delay * 2, 0.1)
    return Owner(None, readable=False)


def read_owners(
    uris: Sequence[str], storage_options: StorageOptions | None = None
) -> dict[str, Owner]:
    """The owner of each object of ``uris`` (in parallel on object stores)."""
    owners = each_uri(uris, lambda u: read_owner(u, storage_options))
    return dict(zip(uris, owners, strict=True))


def take(location: TableLocation, uri: str, storage_options: StorageOptions | None = None) -> bool:
    """Create the owner marker of ``uri`` naming the table at ``location``: False if a marker
    exists already (whoever it names).

    >>> import tempfile
    >>> location, clip = TableLocation(tempfile.mkdtemp()), f"file://{tempfile.mkdtemp()}/a"
    >>> take(location, clip), take(location, clip), read_owner(clip).is_table(location)
    (True, False, True)
    """
    marker = owner_marker(uri)
    store = object_store(marker, storage_options)
    body = json.dumps(
        {"format": OWNER_FORMAT, "table": location.root_uri, "created": time.time()}
    ).encode()
    markers = marker.rsplit("/", 1)[0]
    # a link or a file where the markers' folder belongs: never written through (a link to a
    # user's folder would get the marker), cleared (the link itself) and the folder made
    own_folder(store, markers.rsplit("/", 1)[0], OWNER_DIR)
    if put_new(store, marker, body):
        return True
    # what no table's marker is (a directory, a link, a file its creator died before writing)
    # is taken over; garbage may be another table's damaged marker: it stays (see explain)
    found = _judged(store, marker)
    if found is None or not _stale(store, marker, found):
        return False
    return clear_once(store, marker, found) and put_new(store, marker, body)


def _judged(store: ObjectStore, marker: str) -> Found | None:
    """What stands at ``marker``, once it can be judged: an empty file is given the time its
    creator (another table's write, between its create and its write) needs to fill it."""
    deadline = time.monotonic() + EMPTY_SECONDS + 0.5
    while True:
        found = found_at(store, marker)
        fresh = found is not None and found.is_object and not found.body
        if not fresh or found.age(store, marker) >= EMPTY_SECONDS:
            return found
        if time.monotonic() > deadline:
            return found
        time.sleep(0.05)


@dataclass(frozen=True)
class Claimed:
    """What :func:`claim` did: the URIs whose marker it created (``created``), and the objects
    another table owns (``refused``: their owner)."""

    created: list[str]
    refused: dict[str, Owner]

    def error(self, location: TableLocation) -> ManagedObjectOwnedError:
        """The error that refuses a write handing the ``refused`` objects over."""
        return ManagedObjectOwnedError(_refusal(location, self.refused))


def claim(
    location: TableLocation,
    uris: Sequence[str],
    storage_options: StorageOptions | None = None,
    *,
    foreign: Callable[[], dict[str, str]] | None = None,
) -> Claimed:
    """Make the table at ``location`` the owner of each object of ``uris`` (distinct URIs;
    markers made in parallel on object stores) that has no owner yet. An object whose marker
    names another table, or cannot be read, is ``refused``. ``foreign()`` (read only when a
    marker was created) maps URIs to the other table whose registry entry this table carries
    (a copied table carries the original's): such an object is refused too, its new marker
    removed at once.

    >>> import tempfile
    >>> clip = f"file://{tempfile.mkdtemp()}/clip.mp4"
    >>> train, test = TableLocation(tempfile.mkdtemp()), TableLocation(tempfile.mkdtemp())
    >>> claim(train, [clip]).created == [clip], claim(train, [clip]).created
    (True, [])
    >>> claim(test, [clip]).refused[clip].is_table(train)
    True
    """
    if not uris:
        return Claimed([], {})
    created = each_uri(uris, lambda u: _attempt(lambda: take(location, u, storage_options)))
    mine = [u for u, new in zip(uris, created, strict=True) if new is True]
    failed = [(u, e) for u, e in zip(uris, created, strict=True) if isinstance(e, Exception)]
    if failed:
        release(mine, storage_options)
        uri, exc = failed[0]
        raise ExternalBlobError(
            f"could not record the owner of managed object {uri} ({owner_marker(uri)}: {exc}); "
            "a table needs to write next to the objects it manages (gc deletes them there); "
            "nothing was committed"
        ) from exc
    try:
        others = [u for u, new in zip(uris, created, strict=True) if not new]
        owners = read_owners(others, storage_options)
        recorded = foreign() if mine and foreign is not None else {}
    except BaseException as exc:
        cleanup_after(exc, lambda: release(mine, storage_options))
        raise
    refused = {u: o for u, o in owners.items() if not o.is_table(location)}
    taken = [u for u in mine if u in recorded]
    release(taken, storage_options)
    refused.update({u: Owner(recorded[u]) for u in taken})
    return Claimed([u for u in mine if u not in recorded], refused)


def release(uris: Sequence[str], storage_options: StorageOptions | None = None) -> None:
    """Remove the owner markers of ``uris`` (those a write created and did not commit, or those
    of objects gc deleted); best effort: a marker left names a table that no longer needs it."""

    def remove(uri: str) -> None:
        marker = owner_marker(uri)
        try:
            object_store(marker, storage_options).delete(marker)
        except OSError:
            return

    each_uri(uris, remove)


def _attempt(call: Callable[[], T]) -> T | Exception:
    """``call()``, or the error it raised: one failure among parallel creates must not hide
    which markers the others created."""
    try:
        return call()
    except Exception as exc:
        return exc


def _refusal(location: TableLocation, refused: dict[str, Owner]) -> str:
    shown = sorted(refused)[:3]
    more = f" and {len(refused) - 3} more" if len(refused) > 3 else ""
    named = "; ".join(explain(u, refused[u]) for u in shown)
    return (
        f"managed object(s) this write hands to table {location.root_uri} belong to another "
        f"table: {named}{more} (markers in {OWNER_DIR}/ next to the objects). A managed object "
        "has one owning table: reference it unmanaged (outside this table's managed bases, "
        "without managed=True), or give this table a managed folder of its own; nothing was "
        "committed"
    )


def _stale(store, marker: str, found: Found) -> bool:
    """Whether ``found`` at an owner ``marker`` names no table for sure: not a file, or a
    file still empty :data:`~blobhouse.io.leftovers.EMPTY_SECONDS` after it was made."""
    if not found.is_object:
        return True
    return not found.body and found.age(store, marker) >= EMPTY_SECONDS


def explain(uri: str, owner: Owner) -> str:
    """Who owns the managed object at ``uri``, as a refusal or gc's report names it; for an
    unreadable marker, the command that clears it.

    >>> explain("/m/a.mp4", Owner(None, readable=False))  # doctest: +ELLIPSIS
    '/m/a.mp4 is owned by an unreadable owner marker (/m/.blobhouse-owner/a.mp4.json: ...'
    """
    if owner.readable:
        return f"{uri} is owned by {owner.describe()}"
    marker = owner_marker(uri)
    return (
        f"{uri} is owned by an unreadable owner marker ({marker}: not what blobhouse writes; "
        f"if no other table manages the object, clear it with `{clear_command(marker)}` "
        "and run again)"
    )


def _parsed(body: bytes) -> str | None:
    """The owner's root uri a marker names, or None when it is not a marker."""
    try:
        parsed = json.loads(body)
        table = parsed.get("table") if parsed.get("format") == OWNER_FORMAT else None
    except (ValueError, AttributeError):
        return None
    return table if isinstance(table, str) and table else None

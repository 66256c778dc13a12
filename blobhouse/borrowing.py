"""Copies borrow the managed objects their original owns, and the owner's gc keeps them.

A copied table (``cp -r``, a bucket sync) references the managed objects of its original, but
the owner markers name the original (:mod:`blobhouse.ownership`): once the original stops
referencing one, its gc would delete it while the copy still reads it. ``relocate`` (run on a
copy: it points the copy's manifests home) makes the copy a *borrower* of each object its
registry carries from the original: a marker beside the object's owner marker,
``.blobhouse-owner/borrowed/<borrower id>/<name>.json`` naming the copy's root
(:func:`blobhouse.layout.borrower_marker`). The owner's gc deletes an object only when no
borrower of it still exists (a listing of the borrower's ``_versions/``); the marker of a
borrower that is gone is removed. The copy's gc gives an object back (removes its marker) once
none of its retained versions references it.

What it cannot cover: a copy that never ran ``relocate`` (its ``verify`` names every such
object as a problem), an owner running a blobhouse without borrowers, and a borrower marker made
in the instant between the owner's gc looking for borrowers and deleting the object (the
owner's gc deletes an object only after two runs a grace period apart: relocate a copy before
the original's gc next runs).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Sequence

from blobhouse.errors import StoreError
from blobhouse.io.objects import StorageOptions, each_uri, object_store, read_object
from blobhouse.layout import (
    VERSIONS_DIR,
    TableLocation,
    borrowed_dir,
    borrower_id,
    borrower_marker,
)
from blobhouse.ownership import OWNER_FORMAT

_MARKER_READ_BYTES = 64 * 1024  # more than a marker holds: one GET


def borrow(
    location: TableLocation, uris: Sequence[str], storage_options: StorageOptions | None = None
) -> None:
    """Make the table at ``location`` a borrower of each managed object of ``uris`` (another
    table owns them): its marker beside each (in parallel on object stores)."""
    body = json.dumps(
        {"format": OWNER_FORMAT, "table": location.root_uri, "created": time.time()}
    ).encode()

    def leave(uri: str) -> None:
        marker = borrower_marker(uri, location.root_uri)
        object_store(marker, storage_options).put(marker, body)

    each_uri(uris, leave)


def borrowed_by(
    location: TableLocation, uris: Iterable[str], storage_options: StorageOptions | None = None
) -> set[str]:
    """Those of ``uris`` the table at ``location`` borrowed: one listing of its markers per
    folder."""
    found: set[str] = set()
    mine = borrower_id(location.root_uri)
    for folder, names in _by_folder(uris).items():
        listed = _listed(f"{borrowed_dir(folder)}/{mine}", storage_options)
        found |= {f"{folder}/{name}" for name in names if f"{name}.json" in listed}
    return found


def borrowers(
    uris: Iterable[str], storage_options: StorageOptions | None = None
) -> dict[str, dict[str, str]]:
    """The borrowers of each of ``uris`` that has any: uri -> {marker: borrower's root}, from
    one listing per folder and a read of each marker found (one that cannot be read names
    no root: an empty string, a borrower gc cannot judge)."""
    found: dict[str, dict[str, str]] = {}
    for folder, names in _by_folder(uris).items():
        markers = borrowed_dir(folder)
        for listed in _listed(markers, storage_options):
            _, _, marker_name = listed.partition("/")
            name = marker_name.removesuffix(".json")
            if name != marker_name and name in names:
                found.setdefault(f"{folder}/{name}", {})[f"{markers}/{listed}"] = ""
    for roots in found.values():
        for marker in roots:
            roots[marker] = _root(marker, storage_options)
    return found


def exists(root: str, storage_options: StorageOptions | None = None) -> bool:
    """Whether a table stands at ``root`` (its versions' folder lists something); True when the
    store cannot answer (gc keeps what it cannot judge)."""
    folder = f"{root.rstrip('/')}/{VERSIONS_DIR}"
    try:
        return next(iter(object_store(folder, storage_options).walk(folder)), None) is not None
    except FileNotFoundError:
        return False
    except (OSError, StoreError, ValueError):
        return True


def give_back(
    location: TableLocation, uris: Iterable[str], storage_options: StorageOptions | None = None
) -> int:
    """Remove the borrower markers the table at ``location`` left for ``uris`` (it no longer
    references them); how many there were."""
    markers = [
        borrower_marker(uri, location.root_uri)
        for uri in borrowed_by(location, uris, storage_options)
    ]
    if markers:
        object_store(markers[0], storage_options).delete_many(markers)
    return len(markers)


def _by_folder(uris: Iterable[str]) -> dict[str, set[str]]:
    folders: dict[str, set[str]] = {}
    for uri in uris:
        folder, name = uri.rsplit("/", 1)
        folders.setdefault(folder, set()).add(name)
    return folders


def _listed(folder: str, storage_options: StorageOptions | None) -> set[str]:
    try:
        return {info.name for info in object_store(folder, storage_options).walk(folder)}
    except (OSError, StoreError):  # no folder: no marker
        return set()


def _root(marker: str, storage_options: StorageOptions | None) -> str:
    try:
        body = json.loads(read_object(marker, storage_options, size=_MARKER_READ_BYTES))
        root = body.get("table") if body.get("format") == OWNER_FORMAT else None
    except (OSError, ValueError, AttributeError):
        return ""
    return root if isinstance(root, str) else ""

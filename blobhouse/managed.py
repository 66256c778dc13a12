"""Managed external objects (Hudi RFC-100's ``managed`` flag): external objects a write hands to
the table, which gc deletes once no retained version of any branch or tag references them.

Layout under the table root (one registry for the whole table, every branch included)::

    _blobs/managed/registry/<write id>-<uuid>.json   URIs committed writes handed to the table
    _blobs/managed/unreferenced/<sha256 of the uri>  gc saw the object unreferenced (retired)
    _blobs/managed/doomed/<sha256 of the uri>        gc deletes it later; writes referencing it
                                                     fail meanwhile

A write decides which of its external URIs are managed (:class:`ManagedPolicy`: the row's
``managed`` flag, a managed base, or an object the table manages already) and carries them in
its :class:`~blobhouse.files.session.WrittenFile` s to the commit. Right before the Lance
commit they are checked (:func:`check_usable`), right after it recorded (:func:`register`): a
write that never commits hands nothing over, and a crash between commit and record leaves the object
unmanaged (a leak, never a wrong delete). Each managed object has one owning table, named by
an owner marker next to it (:mod:`blobhouse.ownership`), made right before the commit too.
gc's rules are :class:`Reclaim`; the argument is in docs/managed-objects.md.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import uuid
from collections.abc import Container, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import pyarrow as pa

from blobhouse.borrowing import borrow, borrowers, exists, give_back
from blobhouse.errors import ManagedObjectRaceError, StoreError
from blobhouse.io.leftovers import folder_leftovers, own_folder
from blobhouse.io.objects import (
    STAT_THREADS,
    StorageOptions,
    is_local,
    object_sizes,
    object_store,
    read_object,
)
from blobhouse.io.uris import as_uri
from blobhouse.layout import (
    DOOMED_DIR,
    MANAGED_DIR,
    REGISTRY_DIR,
    UNREFERENCED_DIR,
    TableLocation,
    same_location,
    store_dir,
)
from blobhouse.ownership import Owner, read_owner, read_owners, release, take
from blobhouse.placement import AllowedBases

FORMAT = 1
COMPACT_FILES = 8  # more registry files than this and gc merges them into one


def managed_dir(table_path: str) -> str:
    """Where the managed-object registry and gc's markers of the table at ``table_path`` live.

    >>> managed_dir("/data/t")
    '/data/t/_blobs/managed'
    """
    return f"{store_dir(table_path)}/{MANAGED_DIR}"


def managed_folder(
    table_path: str, sub: str, storage_options: StorageOptions | None = None, *, writing: bool
) -> str | None:
    """The uri of the table's managed folder ``sub`` (:data:`REGISTRY_DIR`, ...). A link or a
    file standing where it belongs (another tool's; on a local disk) is cleared when
    ``writing`` (never what a link leads to); when reading, the folder is then empty (None):
    nothing is read, or removed, through it."""
    root = as_uri(table_path.rstrip("/"))
    folder = as_uri(f"{managed_dir(table_path)}/{sub}")
    store, relative = object_store(folder, storage_options), folder.removeprefix(root + "/")
    if writing:
        own_folder(store, root, relative)
        return folder
    return None if folder_leftovers(store, root, relative) else folder


def marker_name(uri: str) -> str:
    """The name of gc's markers for the object at ``uri`` (a hash: any uri makes a safe name).

    >>> len(marker_name("s3://bucket/clip.mp4"))
    64
    """
    return hashlib.sha256(uri.encode()).hexdigest()


@dataclass(frozen=True)
class Registry:
    """The objects a table manages: uri -> when it was last registered (store clock), read from
    the registry files of this table (``files``, names relative to the registry directory).

    Entries recorded for another root (the table was copied or moved: the copy would share
    ownership with the original) are ignored and counted as ``foreign``: such objects stay
    unmanaged here, a leak rather than a delete in two places.
    """

    entries: dict[str, float] = field(default_factory=dict)
    files: tuple[str, ...] = ()
    foreign: int = 0
    #: uri -> the root a foreign entry names: a write here must not take such an object over
    foreign_owners: dict[str, str] = field(default_factory=dict)

    @property
    def uris(self) -> frozenset[str]:
        return frozenset(self.entries)

    @property
    def carried(self) -> frozenset[str]:
        """The objects whose entries another table's registry files hold (a copy's, from its
        original: see :mod:`blobhouse.borrowing`)."""
        return frozenset(self.foreign_owners)

    @classmethod
    def load(
        cls, location: TableLocation, storage_options: StorageOptions | None = None
    ) -> Registry:
        """The registry of the table at ``location`` (empty when nothing was handed over).

        A file that cannot be read or parsed (one being written right now) is left out: its
        objects are unmanaged for this reader, which only ever keeps more.

        >>> import tempfile
        >>> Registry.load(TableLocation(tempfile.mkdtemp())).entries
        {}
        """
        folder = managed_folder(location.root, REGISTRY_DIR, storage_options, writing=False)
        if folder is None:
            return cls({}, (), 0, {})
        listed = [i for i in object_store(folder, storage_options).list(folder) if _is_file(i.name)]
        bodies = _read_all([f"{folder}/{i.name}" for i in listed], storage_options)
        entries: dict[str, float] = {}
        files, foreign, owners = [], 0, {}
        for info, body in zip(listed, bodies, strict=True):
            parsed = _parsed(body)
            if parsed is None:
                continue
            objects = parsed["objects"]
            if not same_location(parsed["table"], location.root_uri):
                foreign += len(objects)
                owners.update({e["uri"]: parsed["table"] for e in objects})
                continue
            files.append(info.name)
            for entry in objects:
                at = float(entry.get("registered", info.mtime))
                entries[entry["uri"]] = max(at, entries.get(entry["uri"], at))
        return cls(entries, tuple(files), foreign, owners)

    def rewrite(
        self,
        location: TableLocation,
        dropped: Iterable[str] = (),
        storage_options: StorageOptions | None = None,
    ) -> None:
        """Replace the files read by one holding every entry but ``dropped`` (their times
        kept): how gc forgets deleted objects and merges many small files. Files written since
        the load are left alone."""
        dropped = set(dropped)
        kept = {u: at for u, at in self.entries.items() if u not in dropped}
        folder = managed_folder(location.root, REGISTRY_DIR, storage_options, writing=True)
        if kept:
            objects = [{"uri": u, "registered": at} for u, at in sorted(kept.items())]
            _put_registry_file(
                f"{folder}/gc-{uuid.uuid4().hex}.json", location, objects, storage_options
            )
        store = object_store(folder, storage_options)
        for name in self.files:
            with contextlib.suppress(OSError):
                store.delete(f"{folder}/{name}")


def register(
    location: TableLocation,
    schema: pa.Schema,
    uris: Sequence[str],
    name_prefix: str,
    storage_options: StorageOptions | None = None,
) -> None:
    """Record that a committed write (``name_prefix``) handed ``uris`` to the table whose
    committed schema is ``schema``. Only URIs under the bases that schema allows are recorded
    (a hand-made :class:`~blobhouse.files.session.WrittenFile` cannot give gc anything else).

    >>> import tempfile, os
    >>> from blobhouse.properties import TableProperties
    >>> root, media = tempfile.mkdtemp(), tempfile.mkdtemp()
    >>> clip = f"file://{os.path.realpath(media)}/clip.mp4"
    >>> properties = TableProperties(allowed_bases=(media,))
    >>> schema = pa.schema([]).with_metadata(properties.schema_metadata())
    >>> register(TableLocation(root), schema, [clip], "w1-")
    >>> sorted(Registry.load(TableLocation(root)).entries) == [clip]
    True
    """
    bases = AllowedBases.of_table(schema, location.root_uri)
    allowed = [u for u in dict.fromkeys(uris) if bases.resolve(u) == (u, "")]
    if not allowed:
        return
    folder = managed_folder(location.root, REGISTRY_DIR, storage_options, writing=True)
    uri = f"{folder}/{name_prefix}{uuid.uuid4().hex}.json"
    _put_registry_file(uri, location, [{"uri": u} for u in allowed], storage_options)


def check_usable(
    table_path: str, uris: Sequence[str], storage_options: StorageOptions | None = None
) -> None:
    """Refuse to commit references to managed objects gc doomed, or that are gone, since the
    write looked at them (it runs right before the Lance commit; docs/managed-objects.md).

    >>> import tempfile
    >>> check_usable(tempfile.mkdtemp(), [])
    """
    if not uris:
        return
    doomed = markers(table_path, DOOMED_DIR, storage_options)
    clash = sorted(u for u in uris if marker_name(u) in doomed)
    if clash:
        raise ManagedObjectRaceError(
            f"managed object(s) {_few(clash)} this write references are being deleted by gc "
            "(no retained version referenced them for longer than its grace period); nothing "
            "was committed"
        )
    sizes = object_sizes(list(uris), storage_options)
    gone = [u for u, size in zip(uris, sizes, strict=True) if size is None]
    if gone:
        raise ManagedObjectRaceError(
            f"managed object(s) {_few(gone)} this write references are gone (deleted by gc or "
            "by someone else while the write ran); nothing was committed"
        )


class ManagedPolicy:
    """Which external URIs one writing process hands to the table: rows flagged ``managed``,
    URIs under a managed base, and objects the table manages already (managed wins once
    registered: such a reference is checked and registered like any managed one). The registry
    is read once, when the first plain reference is met.

    >>> import tempfile
    >>> policy = ManagedPolicy(AllowedBases(managed=["/m"]), TableLocation(tempfile.mkdtemp()))
    >>> policy.managed("file:///m/a.bin", False), policy.managed("file:///x/b.bin", True)
    (True, True)
    >>> policy.managed("file:///x/c.bin", False)
    False
    """

    def __init__(
        self,
        bases: AllowedBases,
        location: TableLocation,
        storage_options: StorageOptions | None = None,
    ) -> None:
        self.bases = bases
        self.location = location
        self.storage_options = storage_options
        self._registered: frozenset[str] | None = None

    def managed(self, uri: str, flagged: bool) -> bool:
        """Whether the reference to normalized ``uri`` (``flagged``: the row says managed)
        hands the object to the table."""
        if flagged or self.bases.is_managed(uri):
            return True
        if self._registered is None:
            self._registered = Registry.load(self.location, self.storage_options).uris
        return uri in self._registered


def markers(
    table_path: str, folder: str, storage_options: StorageOptions | None = None
) -> dict[str, float]:
    """gc's markers in ``folder`` (:data:`UNREFERENCED_DIR` or :data:`DOOMED_DIR`): marker
    name -> when it was written (store clock)."""
    root = managed_folder(table_path, folder, storage_options, writing=False)
    if root is None:
        return {}
    return {i.name: i.mtime for i in object_store(root, storage_options).list(root)}


def borrow_carried(location: TableLocation, storage_options: StorageOptions | None = None) -> int:
    """Borrow the managed objects the table's registry carries from another table's (a copy
    carries its original's) whose owner marker names another table: that table's gc then
    keeps them while this one exists (:mod:`blobhouse.borrowing`). How many."""
    carried = sorted(Registry.load(location, storage_options).carried)
    owners = read_owners(carried, storage_options)
    others = [
        uri
        for uri, owner in owners.items()
        if owner.table is not None and not owner.is_table(location)
    ]
    borrow(location, others, storage_options)
    return len(others)


@dataclass
class Reclaim:
    """What one gc run does with the table's managed objects.

    Each registered object that no retained version references goes through three steps, one
    per gc run at least: *retired* (an ``unreferenced`` marker records when gc first saw it
    unreferenced), *doomed* once that marker and its registration are older than the grace
    period (a ``doomed`` marker: writes referencing it now refuse to commit), *reaped* once the
    doomed marker is older than the grace period: the object is deleted (one the user deleted
    already is just forgotten) and leaves the registry. An object a retained version references
    again is *resurrected* (its markers removed). Nothing is retired or doomed when the mark is
    incomplete (a branch or data file could not be read), nor deleted outside the bases the
    table allows, nor deleted unless its owner marker names this table
    (:mod:`blobhouse.ownership`; one of no marker is claimed first): one another table owns
    is kept and leaves the registry, one whose marker cannot be read is kept.
    """

    location: TableLocation
    storage_options: StorageOptions | None
    registry: Registry
    referenced: int = 0
    retire: list[str] = field(default_factory=list)
    doom: list[str] = field(default_factory=list)
    reap: dict[str, int | None] = field(default_factory=dict)  # uri -> size (None: gone)
    resurrect: list[str] = field(default_factory=list)
    waiting: int = 0
    undecided: int = 0
    outside: list[str] = field(default_factory=list)
    stale: list[tuple[str, str]] = field(default_factory=list)  # markers of no entry
    failed: dict[str, str] = field(default_factory=dict)  # uri -> why it was not deleted
    unclaimed: set[str] = field(default_factory=set)  # to reap, no owner marker: claimed first
    owned: set[str] = field(default_factory=set)  # to reap (or gone), marker names this table
    elsewhere: dict[str, Owner] = field(default_factory=dict)  # kept: another owner (or none)
    borrowed: dict[str, list[str]] = field(default_factory=dict)  # kept: copies borrowed them
    give_back: list[str] = field(default_factory=list)  # borrowed from another table, unused
    gone_borrowers: list[str] = field(default_factory=list)  # markers of copies that are gone
    given_back: int = 0

    @classmethod
    def plan(
        cls,
        location: TableLocation,
        bases: AllowedBases,
        registry: Registry,
        referenced: Container[str],
        *,
        complete: bool,
        cutoff: float,
        storage_options: StorageOptions | None = None,
    ) -> Reclaim:
        """Decide every registered object's step: ``referenced`` holds the URIs retained
        versions reference (``complete``: the mark read everything), ``cutoff`` is the mark's
        start less the grace period (store clock)."""
        plan = cls(location, storage_options, registry)
        unreferenced = markers(location.root, UNREFERENCED_DIR, storage_options)
        doomed = markers(location.root, DOOMED_DIR, storage_options)
        due: list[str] = []
        waiting: list[str] = []
        for uri, registered_at in sorted(registry.entries.items()):
            name = marker_name(uri)
            if uri in referenced:
                plan.referenced += 1
                if name in unreferenced or name in doomed:
                    plan.resurrect.append(uri)
            elif not complete:
                plan.undecided += 1
            elif bases.resolve(uri) != (uri, "") or not bases.may_own(uri):
                plan.outside.append(uri)  # the table's bases changed: never deleted
            elif name in doomed:
                (due if doomed[name] < cutoff else waiting).append(uri)
            elif name in unreferenced:
                since = max(unreferenced[name], registered_at)
                (plan.doom if since < cutoff else waiting).append(uri)
            else:
                plan.retire.append(uri)
        plan.waiting = len(waiting)
        plan.reap = dict(zip(due, object_sizes(due, storage_options), strict=True))
        plan._judge_owners()
        plan._keep_borrowed()
        if complete:  # a copy's: what it borrowed from its original and references no more
            plan.give_back = sorted(u for u in registry.carried if u not in referenced)
        names = {marker_name(u) for u in registry.entries}
        plan.stale = [
            (folder, name)
            for folder, found in ((UNREFERENCED_DIR, unreferenced), (DOOMED_DIR, doomed))
            for name in found
            if name not in names
        ]
        return plan

    def _judge_owners(self) -> None:
        """Keep the objects to reap that this table does not own (an owner marker naming
        another table, or one that cannot be read: gc keeps what it cannot judge); an object
        of no marker (registered before markers existed) is claimed when it is reaped."""
        owners = read_owners(list(self.reap), self.storage_options)
        for uri, owner in owners.items():
            if owner.is_table(self.location):
                self.owned.add(uri)
            elif self.reap[uri] is None:
                continue  # gone already: forgotten, and another table's marker is not ours
            elif owner.readable and owner.table is None:
                self.unclaimed.add(uri)
            else:
                self.elsewhere[uri] = owner
                del self.reap[uri]

    def _keep_borrowed(self) -> None:
        """Keep the objects to reap that a copy of this table borrowed while the copy exists
        (:mod:`blobhouse.borrowing`; a marker that cannot be read keeps it too); the markers
        of copies that are gone are removed when the plan is applied."""
        due = [u for u in self.reap if self.reap[u] is not None and u in self.owned]
        opts = self.storage_options
        for uri, markers in borrowers(due, opts).items():
            alive = [root for root in set(markers.values()) if not root or exists(root, opts)]
            if alive:
                self.borrowed[uri] = sorted(alive)
                del self.reap[uri]
            self.gone_borrowers += [m for m, root in markers.items() if root not in alive]

    def apply(self) -> None:
        """Do what :meth:`plan` decided: markers first, then deletes, then the registry."""
        for uri in self.retire:
            self._mark(UNREFERENCED_DIR, uri)
        for uri in self.doom:
            self._mark(DOOMED_DIR, uri)
        for uri in self.resurrect:
            self._unmark(uri)
        forgotten = [uri for uri in list(self.reap) if self._reap(uri)]
        # another table owns these: they leave this table's registry, the object stays
        forgotten += [u for u, owner in self.elsewhere.items() if owner.readable]
        if forgotten or len(self.registry.files) > COMPACT_FILES:
            self.registry.rewrite(self.location, forgotten, self.storage_options)
        for uri in forgotten:  # after the registry: a crash in between reaps them again
            self._unmark(uri)
        for folder, name in self.stale:
            self._remove(f"{folder}/{name}")
        with contextlib.suppress(OSError, StoreError):  # tried again by the next run
            self.given_back = give_back(self.location, self.give_back, self.storage_options)
            if self.gone_borrowers:
                store = object_store(self.gone_borrowers[0], self.storage_options)
                store.delete_many(self.gone_borrowers)

    def report(self) -> dict:
        """Counts and bytes of what the run did (or, in a dry run, would do)."""
        removed = {u: size for u, size in self.reap.items() if size is not None}
        removed = {u: size for u, size in removed.items() if u not in self.failed}
        return {
            "registered": len(self.registry.entries),
            "referenced": self.referenced,
            "retired": len(self.retire),
            "doomed": len(self.doom),
            "removed": len(removed),
            "removed_bytes": sum(removed.values()),
            "already_missing": sum(1 for size in self.reap.values() if size is None),
            "resurrected": len(self.resurrect),
            "waiting": self.waiting,
            "undecided": self.undecided,
            "kept_outside_bases": len(self.outside),
            "foreign_entries": self.registry.foreign,
            "kept_owned_elsewhere": sum(1 for o in self.elsewhere.values() if o.readable),
            "kept_unknown_owner": sum(1 for o in self.elsewhere.values() if not o.readable),
            "kept_borrowed": len(self.borrowed),
            "kept": [f"{u}: owned by {o.describe()}" for u, o in sorted(self.elsewhere.items())]
            + [
                f"{u}: borrowed by {', '.join(r or 'an unreadable marker' for r in roots)}"
                for u, roots in sorted(self.borrowed.items())
            ],
            "given_back": self.given_back,
            "failed": [f"{uri}: {why}" for uri, why in sorted(self.failed.items())],
            "paths": sorted(removed),
        }

    def _reap(self, uri: str) -> bool:
        """Delete one object this table owns, then its owner marker; whether it may leave the
        registry. One of no marker is claimed first: if a write claimed it meanwhile, it is
        kept (another table's leaves the registry; this table's is judged again next run)."""
        claimed = self._take(uri) if uri in self.unclaimed else True
        if claimed is None:
            return False
        if not claimed:
            owner = read_owner(uri, self.storage_options)
            if not owner.is_table(self.location):
                self.elsewhere[uri] = owner
            del self.reap[uri]
            return False
        if self.reap[uri] is not None and not self._delete(uri):
            return False
        if uri in self.owned or uri in self.unclaimed:
            release([uri], self.storage_options)
        return True

    def _take(self, uri: str) -> bool | None:
        """Claim an object of no owner marker: whether this table now owns it (False: a
        marker appeared meanwhile), None if the marker cannot be made (the object is kept,
        reported as failed, and tried again by the next run)."""
        try:
            return take(self.location, uri, self.storage_options)
        except (OSError, ValueError) as exc:
            self.failed[uri] = f"its owner marker could not be created: {exc}"
            return None

    def _delete(self, uri: str) -> bool:
        try:
            object_store(uri, self.storage_options).delete(uri)
        except (OSError, ValueError) as exc:  # kept, and tried again by the next run
            self.failed[uri] = str(exc)
            return False
        return True

    def _mark(self, folder: str, uri: str) -> None:
        own = managed_folder(self.location.root, folder, self.storage_options, writing=True)
        path = f"{own}/{marker_name(uri)}"
        object_store(path, self.storage_options).put(path, uri.encode())

    def _unmark(self, uri: str) -> None:
        for folder in (UNREFERENCED_DIR, DOOMED_DIR):
            self._remove(f"{folder}/{marker_name(uri)}")

    def _remove(self, relative: str) -> None:
        path = as_uri(f"{managed_dir(self.location.root)}/{relative}")
        with contextlib.suppress(OSError):
            object_store(path, self.storage_options).delete(path)


def _put_registry_file(
    uri: str,
    location: TableLocation,
    objects: list[dict],
    storage_options: StorageOptions | None,
) -> None:
    body = {"format": FORMAT, "table": location.root_uri, "objects": objects}
    object_store(uri, storage_options).put(uri, json.dumps(body).encode())


def _parsed(body: bytes | None) -> Mapping | None:
    """A registry file's content, or None when it is unreadable or not one."""
    if body is None:
        return None
    try:
        parsed = json.loads(body)
        ok = parsed.get("format") == FORMAT and isinstance(parsed.get("table"), str)
        ok = ok and all(_is_entry(e) for e in parsed["objects"])
    except (ValueError, TypeError, KeyError, AttributeError):
        return None
    return parsed if ok else None


def _read_all(uris: list[str], storage_options: StorageOptions | None) -> list[bytes | None]:
    """Each object's bytes (None: gone since it was listed, as gc merged it); on an object
    store the requests run in parallel."""

    def read(uri: str) -> bytes | None:
        try:
            return read_object(uri, storage_options)
        except OSError:
            return None

    threads = 1 if all(is_local(u) for u in uris) else min(len(uris), STAT_THREADS)
    with ThreadPoolExecutor(max(threads, 1)) as pool:
        return list(pool.map(read, uris))


def _is_entry(entry: Mapping) -> bool:
    registered = entry.get("registered", 0.0)
    return isinstance(entry.get("uri"), str) and isinstance(registered, int | float)


def _is_file(name: str) -> bool:
    return "/" not in name and name.endswith(".json")


def _few(uris: Sequence[str], shown: int = 3) -> str:
    more = f" and {len(uris) - shown} more" if len(uris) > shown else ""
    return ", ".join(uris[:shown]) + more

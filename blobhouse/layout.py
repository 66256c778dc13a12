"""Where a table lives (its root, its branches, the base paths its manifests record) and the
name of every file blobhouse writes or recognizes in it.

A table is a tree of Lance datasets: main at the root, each branch at ``<root>/tree/<name>``
(Lance's layout), tags and branch records under ``<root>/_refs``. Everything blobhouse owns
besides data files is shared by the whole tree and lives at the root: the store (``_blobs``),
write leases (``_leases``).

Every name is decided here, once, for the writers that make the files, gc that removes them and
verify that checks them (PyIceberg's ``LocationProvider``): data files and their sidecars, store
packs and tombstones, claims, leases, locks, owner markers, the managed-object registry, what a
write stages before it commits and so what a failed create leaves.

Lance records base paths (the store, and a branch's parent datasets) as absolute URIs in each
manifest, so a table copied or moved elsewhere still names its old place. :class:`BasePaths`
reads every manifest's bases relative to where the table is *now*: the table's own bases are
mapped from the root the manifest recorded to the current root, so a moved table never reads
or writes its old location; bases outside the recorded root (a shallow clone's source) are
read as they are, as Lance does.
"""

from __future__ import annotations

import json
import os
import re
import uuid
from dataclasses import dataclass
from urllib.parse import quote, unquote

import blake3
from lance import LanceDataset

from blobhouse.errors import InvalidInputError
from blobhouse.io.objects import (
    StorageOptions,
    is_local,
    long_name,
    object_store,
    read_object,
    uri_to_path,
)
from blobhouse.io.uris import as_uri, child_of, local_uri, normalize_uri

TREE_DIR = "tree"
VERSIONS_DIR = "_versions"  # Lance's manifests, one per version
REFS_DIR = "_refs"
DATA_DIR = "data"  # a dataset's data files (main's at the root, a branch's in tree/<name>)
TRANSACTIONS_DIR = "_transactions"  # Lance's transaction files, one per commit
# the directories of a dataset (main's root, or a branch's tree/<name>) Lance's cleanup lists
INDICES_DIR = "_indices"  # Lance's index files, a folder per index (and delta)
DELETIONS_DIR = "_deletions"  # Lance's deletion files
LANCE_DIRS = (VERSIONS_DIR, TRANSACTIONS_DIR, DATA_DIR, INDICES_DIR, DELETIONS_DIR)
STORE_DIR = "_blobs"
STORE_BASE_NAME = "blobhouse-store"  # a relocated store's base is named "<this>@<n>"
TAGS_DIR = f"{REFS_DIR}/tags"  # Lance's tag records, one JSON file per tag
# what Lance accepts as a branch name, and as a tag name
BRANCH_NAME = re.compile(r"[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+)*")
TAG_NAME = re.compile(r"[\w-][\w.-]*")  # letters and digits of any script, as Lance's

# -- the names blobhouse gives files --------------------------------------------------------------
# Everything blobhouse owns besides data files lives at the root, shared by the whole tree.
LEASES_DIR = "_leases"  # a running write's lease, one per write (blobhouse.commit.leases)
LOCKS_DIR = f"{LEASES_DIR}/locks"  # short exclusive locks (blobhouse.commit.locks)
PACKS_DIR = "packs"  # in STORE_DIR: payloads back to back, written once (blobhouse.store)
TOMBSTONES_DIR = "tombstones"  # in STORE_DIR: retired packs, kept through gc's grace
CLAIMS_DIR = "claims"  # in STORE_DIR: a Spark write's claims on new payloads (store.claims)
STORED_DIR = "stored"  # in STORE_DIR: what a store-first write stored, until its commit (records)
INDEX_DIR = "index"  # in STORE_DIR: the store index's level 0, a Lance dataset (store.index)
# in STORE_DIR: the index's level 1 once it is big, a Lance dataset per hash prefix (store.index)
INDEX_SHARDS_DIR = "index-shards"
# in the store index's folder, the filters of its data files (blobhouse.store.digest_filter): Lance
# leaves folders of its own names alone
INDEX_FILTERS_DIR = "_filters"
# ... and the digests racing writers stored twice, for compaction to merge (store.duplicates)
INDEX_DUPLICATES_DIR = "_duplicates"
# ... and its sorted runs, one small read a found hash (blobhouse.store.sorted_run)
INDEX_RUNS_DIR = "_runs"
MANAGED_DIR = "managed"  # in STORE_DIR: the managed-object registry (blobhouse.managed) ...
REGISTRY_DIR = "registry"  # ... its records,
UNREFERENCED_DIR = "unreferenced"  # ... objects no version references any more,
DOOMED_DIR = "doomed"  # ... and those gc deletes at its next run
OWNER_DIR = ".blobhouse-owner"  # next to managed objects: one owner marker per object
BORROWED_DIR = "borrowed"  # in OWNER_DIR: what copies of the owner borrowed (a folder each)
PACKS = f"{STORE_DIR}/{PACKS_DIR}"  # (relative to the root)
CLAIMS = f"{STORE_DIR}/{CLAIMS_DIR}"
STORED = f"{STORE_DIR}/{STORED_DIR}"

# the prefix of a transaction's files, "<kind>-<12 hex>-" (older blobhouse named them without the
# kind): its write id, which names its lease too
NAME_PREFIX_PATTERN = r"(?:[a-z]+-)?[0-9a-f]{12}-"
WRITE_PREFIX = re.compile(NAME_PREFIX_PATTERN)
# a data file's name in its data folder, and a pack's path in the store, as a write records them
DATA_FILE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_-]*\.lance")
PACK_NAME = re.compile(r"packs/[A-Za-z0-9_-]+\.pack")
# a pack's path as the index records it: the names blobhouse gives packs (a write's prefix and a
# uuid), so nothing that could climb out of the store (``..``, an encoded ``%2e%2e`` or ``%2f``,
# an absolute path, another bucket's URI)
INDEX_PACK_PATH = re.compile(r"packs/[A-Za-z0-9_-][A-Za-z0-9._-]*\.pack")
PACK_FILE = re.compile(r"[^/]+\.pack")  # a pack's name in PACKS_DIR (anything else: a user's)
CLAIM_FILE = re.compile(r"[^/]+-claims/[^/]+")  # a claim's name in CLAIMS_DIR
STORED_FILE = re.compile(r"[^/]+-stored/[0-9a-f]{32}\.arrow")  # a record's name in STORED_DIR
# the names blobhouse gives the files of the folders it owns (data folders: DATA_FOLDER_FILE)
OWNED_FILE_NAMES = {PACKS: PACK_FILE, CLAIMS: CLAIM_FILE, STORED: STORED_FILE}
# The names Lance and blobhouse give the files of a data folder (``data/``, a branch's
# ``tree/<name>/data/``): data files, the blob sidecars in a folder named after one, an aborted
# Spark write's marker, and the temporary files Lance's writers rename into those (``.tmp*``,
# object_store's ``<name>#<n>``). Anything else there is a user's: gc never removes it, and a new
# table is not made beside it.
DATA_FOLDER_FILE = re.compile(
    r"(?:[^/]+\.lance|[^/]+/[^/]+\.blob)(?:#\d+)?|(?:[^/]+/)?\.tmp[^/]*|aborted-[^/]+"
)


def data_file_name(name_prefix: str) -> str:
    """A new data file's name in its data folder: the write's prefix, then a random part.

    >>> data_file_name("write-0123456789ab-").startswith("write-0123456789ab-")
    True
    """
    return f"{name_prefix}{uuid.uuid4().hex}.lance"


def sidecar_name(blob_id: int) -> str:
    """Lance's sidecar file name: blob_id as 32 binary digits, least-significant bit first.

    >>> sidecar_name(1)
    '10000000000000000000000000000000.blob'
    """
    return format(blob_id, "032b")[::-1] + ".blob"


def sidecar_path(data_file: str, blob_id: int) -> str:
    """A sidecar's path next to ``data_file`` (a name or a path): in a folder named after it.

    >>> sidecar_path("data/f.lance", 2)
    'data/f/01000000000000000000000000000000.blob'
    """
    return f"{data_file.removesuffix('.lance')}/{sidecar_name(blob_id)}"


def sidecar_folder(data_file: str) -> str:
    """The folder of ``data_file``'s sidecars (a name, path or URI alike).

    >>> sidecar_folder("data/f.lance")
    'data/f'
    """
    return data_file.removesuffix(".lance")


def data_file_of(sidecar: str) -> str:
    """The data file a sidecar belongs to (:func:`sidecar_path` read back).

    >>> data_file_of("data/f/01000000000000000000000000000000.blob")
    'data/f.lance'
    """
    return sidecar.rsplit("/", 1)[0] + ".lance"


_SIDECAR = re.compile(r"[01]{32}\.blob")


def is_sidecar(path: str) -> bool:
    """Whether ``path``'s last part is a sidecar's name (:func:`sidecar_name`)."""
    return _SIDECAR.fullmatch(path.rsplit("/", 1)[-1]) is not None


def is_sidecar_of(key: str, path: str) -> bool:
    """Whether ``path`` is a sidecar name in the folder ``key`` (:func:`sidecar_folder`).

    >>> is_sidecar_of("data/f", "data/f/" + sidecar_name(5)), is_sidecar_of("data/f", "data/f/x")
    (True, False)
    """
    folder, _, name = path.rpartition("/")
    return folder == key and _SIDECAR.fullmatch(name) is not None


def blob_id_of(sidecar: str) -> int:
    """The blob_id a sidecar's name says (:func:`sidecar_name` read back).

    >>> blob_id_of("data/f/01000000000000000000000000000000.blob")
    2
    """
    return int(sidecar.rsplit("/", 1)[-1].removesuffix(".blob")[::-1], 2)


def pack_name(name_prefix: str) -> str:
    """A new pack's path in the store, named after the write that stores it.

    >>> pack_name("write-0123456789ab-").startswith("packs/write-0123456789ab-")
    True
    """
    return f"{PACKS_DIR}/{name_prefix}{uuid.uuid4().hex}.pack"


def claims_folder_name(write_id: str) -> str:
    """The folder (in CLAIMS_DIR) of one Spark write's claims.

    >>> claims_folder_name("write-0123456789ab")
    'write-0123456789ab-claims'
    """
    return f"{write_id}-claims"


def stored_folder_name(write_id: str) -> str:
    """The folder (in STORED_DIR) of one store-first write's records of what it stored.

    >>> stored_folder_name("write-0123456789ab")
    'write-0123456789ab-stored'
    """
    return f"{write_id}-stored"


def claim_name(digest: bytes) -> str:
    """The name, in a write's claims folder, of a claim made on its own (once the write's
    claim log is full): the payload's blake3, in hex."""
    return digest.hex()


def claim_log_entry_name(at: int) -> str:
    """The name of entry ``at`` of a write's claim log, in its claims folder (store.claims).

    >>> claim_log_entry_name(12)
    'log-000000000012'
    """
    return f"log-{at:012d}"


def shared_column_name(column: str) -> str:
    """The name, in a write's claims folder, of the mark its tasks leave once they find that
    blob ``column``'s payloads are shared between them (a column name may hold any character:
    its blake3 names it).

    >>> shared_column_name("video")[:15]
    'shared-4d4d9ab8'
    """
    return f"shared-{blake3.blake3(column.encode()).hexdigest()[:32]}"


def stored_record_name() -> str:
    """A new record's name in its write's folder (each step that stores writes its own)."""
    return f"{uuid.uuid4().hex}.arrow"


def index_filter_name() -> str:
    """A new filter's name in the store index's INDEX_FILTERS_DIR (store.digest_filter)."""
    return f"{uuid.uuid4().hex}.bloom"


def index_shard_name(shard: int) -> str:
    """The folder of the index shard holding the hashes whose first byte is ``shard``.

    >>> index_shard_name(10)
    '0a'
    """
    return f"{shard:02x}"


def shard_filter_name(shard: int) -> str:
    """A new filter's name among the index shards' filters (INDEX_SHARDS_DIR/INDEX_FILTERS_DIR):
    the shard's name first, so a lookup reads only the filters of the shards it asks."""
    return f"{index_shard_name(shard)}-{uuid.uuid4().hex}.bloom"


def sorted_run_name() -> str:
    """A new sorted run's name in the store index's INDEX_RUNS_DIR (store.sorted_run)."""
    return f"{uuid.uuid4().hex}.run"


def aborted_marker(name_prefix: str) -> str:
    """The marker an aborted Spark write leaves in its data folder: its tasks still running see it
    and remove their own files."""
    return f"aborted-{name_prefix}"


def owner_marker(uri: str) -> str:
    """The owner marker of the managed object at ``uri``: in a folder next to it.

    >>> owner_marker("s3://bucket/media/clip.mp4")
    's3://bucket/media/.blobhouse-owner/clip.mp4.json'
    """
    folder, name = uri.rsplit("/", 1)
    return f"{folder}/{OWNER_DIR}/{name}.json"


def borrower_marker(uri: str, borrower_root: str) -> str:
    """The marker that the table whose root is ``borrower_root`` (a copy of the object's
    owner) borrowed the managed object at ``uri``: the owner's gc keeps the object while the
    borrower exists. A folder per borrower (32 hex digits of its root's blake3), and the
    object's own name: as long as its owner marker's.

    >>> borrower_marker("s3://bucket/media/clip.mp4", "s3://bucket/copy")[:60]
    's3://bucket/media/.blobhouse-owner/borrowed/de604304416c4513'
    >>> borrower_marker("s3://bucket/media/clip.mp4", "s3://bucket/copy").endswith("/clip.mp4.json")
    True
    """
    folder, name = uri.rsplit("/", 1)
    return f"{borrowed_dir(folder)}/{borrower_id(borrower_root)}/{name}.json"


def borrowed_dir(folder: str) -> str:
    """Where the borrower markers of the managed objects in ``folder`` are."""
    return f"{folder}/{OWNER_DIR}/{BORROWED_DIR}"


def borrower_id(root_uri: str) -> str:
    """A table's folder among the borrower markers: 32 hex digits of its root's blake3."""
    return blake3.blake3(normalize_uri(root_uri).encode()).hexdigest()[:32]


# -- what a failed create leaves -------------------------------------------------------------------
# One description for the write that checks where it creates a table (a failed create's leftovers
# may stand there: prepare.check_target) and for gc, which removes them (clean_failed_create).
WRITE_ID = rf"(?P<write>{NAME_PREFIX_PATTERN})"
# what a write stages before its first commit, named after its write id (its lease's name): gc
# removes these once that lease is gone
STAGED_BY_A_WRITE = tuple(
    re.compile(pattern)
    for pattern in (
        rf"{DATA_DIR}/{WRITE_ID}[0-9a-f]{{32}}\.lance",  # a data file
        rf"{DATA_DIR}/{WRITE_ID}[0-9a-f]{{32}}/[01]{{32}}\.blob",  # its sidecars
        rf"{DATA_DIR}/aborted-{WRITE_ID}",  # an aborted Spark write's marker
        rf"{PACKS}/{WRITE_ID}[0-9a-f]{{32}}\.pack",  # store packs (dedup="global")
        rf"{STORED}/{WRITE_ID}stored/[0-9a-f]{{32}}\.arrow",  # what a store-first write stored
        rf"{TRANSACTIONS_DIR}/0-[0-9a-f-]{{36}}\.txn",  # Lance's commit of the create, interrupted
    )
)
LEASE_FILE = re.compile(rf"{LEASES_DIR}/{WRITE_ID}")
# Lance's temporary files in a data folder (``.tmp*``; object_store's ``<data file>#<n>``): they
# carry no write id, so gc cannot tell a live writer's from a dead one's and leaves them (Lance's
# cleanup removes them); a create tolerates them
LANCE_TEMPORARY = re.compile(
    rf"(?:[^/]+/)?\.tmp[^/]*|{NAME_PREFIX_PATTERN}[0-9a-f]{{32}}\.lance#\d+"
)
# folders with Lance's and blobhouse's names, which no user's folder has by accident: a new table
# may be made where they stand (data/ is not among them: a project's data/ is its own)
FAILED_CREATE_DIRS = frozenset(
    (VERSIONS_DIR, TRANSACTIONS_DIR, DELETIONS_DIR, INDICES_DIR, REFS_DIR, STORE_DIR, LEASES_DIR)
)
# the directories a create makes, deepest first (gc removes them when empty)
CREATE_DIRS = (DATA_DIR, PACKS, STORED, STORE_DIR, LEASES_DIR, TRANSACTIONS_DIR)


def left_by_a_failed_create(path: str) -> bool:
    """Whether ``path`` (relative to the root) is what a failed create may leave: in one of its
    folders, or in data/ a file a write staged or Lance's temporary file.

    >>> left_by_a_failed_create("data/write-0123456789ab-" + "0" * 32 + ".lance")
    True
    >>> left_by_a_failed_create("data/train.lance")
    False
    """
    top = path.partition("/")[0]
    if top in FAILED_CREATE_DIRS:
        return True
    staged = any(pattern.fullmatch(path) for pattern in STAGED_BY_A_WRITE)
    return top == DATA_DIR and (staged or is_lance_temporary(path))


def is_lance_temporary(path: str) -> bool:
    """Whether ``path`` (relative to the root) is a temporary file Lance's writers make in
    data/ and rename when done: what a writer killed mid-file leaves.

    >>> is_lance_temporary("data/.tmpXxDGQ1"), is_lance_temporary("data/mine.tmp")
    (True, False)
    """
    top, _, rest = path.partition("/")
    return top == DATA_DIR and LANCE_TEMPORARY.fullmatch(rest) is not None


@dataclass(frozen=True)
class Tag:
    """A tag: the version of a branch (None: main) it names."""

    name: str
    branch: str | None
    version: int


@dataclass(frozen=True)
class TableLocation:
    """A table's root (an absolute local path or a canonical URI) and the branch in use
    (``None``: main). Resolved where it is made, so it means the same on every machine.

    >>> loc = TableLocation.of("/data/frames", branch="relabel")
    >>> loc.dataset_path, loc.store_path
    ('/data/frames/tree/relabel', '/data/frames/_blobs')
    """

    root: str
    branch: str | None = None

    @classmethod
    def of(
        cls,
        uri: str | os.PathLike,
        branch: str | None = None,
        storage_options: StorageOptions | None = None,
    ) -> TableLocation:
        """The location of ``uri`` (a relative path is resolved here, against this process's
        working directory). A path naming a branch's directory, ``<root>/tree/<name>``, is
        that branch of the table at ``<root>``."""
        uri = os.fspath(uri)
        if not isinstance(uri, str) or not uri:
            raise InvalidInputError(f"a table location must be a path or URI, got {uri!r}")
        if branch == "main":  # Lance's name for the default branch
            branch = None
        if branch is not None and (
            not isinstance(branch, str) or not BRANCH_NAME.fullmatch(branch)
        ):
            raise InvalidInputError(
                f"branch must be a branch name (letters, digits, '.', '-', '_', segments "
                f"joined by single '/'), got {branch!r}"
            )
        if is_local(uri):
            root = os.path.abspath(uri_to_path(uri))
        else:
            root = normalize_uri(uri).rstrip("/")
        found = _branch_of(root, storage_options)
        if found is not None:
            root, named = found
            if branch is not None and branch != named:
                raise InvalidInputError(
                    f"{uri} is the directory of branch {named!r}; it cannot be opened as "
                    f"branch {branch!r}"
                )
            branch = named
        location = cls(root, branch)
        problem = long_name(location.dataset_path)
        if problem is not None:  # the OS would refuse it raw (errno 36) at the first write
            raise InvalidInputError(f"table path {location.dataset_path}: {problem}")
        return location

    def on(self, branch: str | None) -> TableLocation:
        """The same table, on ``branch`` (None: main)."""
        return TableLocation(self.root, branch)

    @property
    def root_uri(self) -> str:
        """The root as an absolute URI (``file://`` locally): references are built from it."""
        return local_uri(self.root) if is_local(self.root) else self.root

    @property
    def dataset_path(self) -> str:
        """What Lance opens: the root for main, ``<root>/tree/<branch>`` for a branch."""
        if self.branch is None:
            return self.root
        return f"{self.root}/{TREE_DIR}/{self.branch}"

    @property
    def dataset_uri(self) -> str:
        return as_uri(self.dataset_path)

    @property
    def data_dir(self) -> str:
        """Where this branch's new data files go."""
        return f"{self.dataset_path}/data"

    def tag(self, name: str, storage_options: StorageOptions | None = None) -> Tag | None:
        """Where tag ``name`` of the table points, read from Lance's tag record
        (``<root>/_refs/tags/<name>.json``) without starting Lance (a process whose DataLoader
        workers fork must not); None when there is no such tag."""
        if not TAG_NAME.fullmatch(name) or ".." in name or name.endswith(".lock"):
            return None  # Lance makes no tag by such a name
        stored = quote(name, safe="")  # Lance percent-encodes the name of the tag's file
        path = child_of(f"{self.root}/{TAGS_DIR}", f"{stored}.json")
        try:
            record = json.loads(read_object(path, storage_options))
        except FileNotFoundError:
            return None
        return Tag(name, record.get("branch"), int(record["version"]))

    def tag_names(self, storage_options: StorageOptions | None = None) -> list[str]:
        """The names of the table's tags."""
        listed = object_store(self.root, storage_options).list(f"{self.root}/{TAGS_DIR}")
        names = (i.name.removesuffix(".json") for i in listed if i.name.endswith(".json"))
        return sorted(map(unquote, names))

    def listed_versions(self, storage_options: StorageOptions | None = None) -> list[int]:
        """Every version of this branch, in order, from the names of its manifests: one
        listing, where Lance's ``versions()`` reads every manifest (quadratic in a history of
        appends, each manifest listing every fragment so far)."""
        store = object_store(self.dataset_path, storage_options)
        listed = store.list(f"{self.dataset_path}/{VERSIONS_DIR}")
        return sorted(v for v in (manifest_version(info.name) for info in listed) if v is not None)

    @property
    def store_path(self) -> str:
        """The table's content-addressed store (one per table, shared by its branches)."""
        return store_dir(self.root)

    @property
    def store_uri(self) -> str:
        return as_uri(self.store_path)

    def __str__(self) -> str:
        return self.root if self.branch is None else f"{self.root} (branch {self.branch})"


def store_dir(table_path: str) -> str:
    """Where the store of the table at ``table_path`` lives (a path or URI, like the table's)."""
    return f"{table_path.rstrip('/')}/{STORE_DIR}"


def branch_data_dir(branch: str | None) -> str:
    """The data directory of ``branch`` (None: main), relative to the table root."""
    return "data" if branch is None else f"{TREE_DIR}/{branch}/data"


def _branch_of(root: str, storage_options: StorageOptions | None) -> tuple[str, str] | None:
    """``(table root, branch)`` when ``root`` is a branch directory ``<root>/tree/<name>`` of a
    table that records that branch, else None."""
    parts = root.split("/")
    for at in range(len(parts) - 2, 0, -1):
        if parts[at] != TREE_DIR:
            continue
        table, name = "/".join(parts[:at]), "/".join(parts[at + 1 :])
        if not BRANCH_NAME.fullmatch(name):
            continue
        # Lance names a branch's record after the branch, "/" written as %2F
        record = as_uri(f"{table}/{REFS_DIR}/branches/{name.replace('/', '%2F')}.json")
        try:
            if object_store(record, storage_options).size(record) is not None:
                return table, name
        except (OSError, ValueError):
            continue
    return None


@dataclass(frozen=True)
class Base:
    """One base path of a manifest, where blobhouse reads it now: ``uri`` (absolute), and
    whether it is a dataset root (files under ``<uri>/data``) or a plain directory."""

    id: int
    name: str | None
    uri: str
    is_dataset_root: bool


class BasePaths:
    """The base paths of one manifest, read relative to where the table is now.

    ``recorded_root`` is the root the manifest was written at: the parent of its store base, or
    (in a branch) the main dataset it points back to. When it differs from the table's root
    the table was copied or moved: the table's own bases (the store, the datasets of the tree)
    are read at the current root instead, and :attr:`moved` is true until :func:`relocate`
    rewrites the manifest.
    """

    def __init__(self, dataset: LanceDataset, location: TableLocation) -> None:
        self.location = location
        recorded = dataset.base_paths()
        self.recorded = {i: as_uri(b.path).rstrip("/") for i, b in recorded.items()}
        self.store_id = next((i for i, b in recorded.items() if is_store_base_name(b.name)), None)
        # a main dataset with a dataset-root base of its own reads through another dataset
        self.clone = location.branch is None and any(
            b.is_dataset_root and b.name is None for b in recorded.values()
        )
        self.recorded_root = self._recorded_root(recorded)
        root = location.root_uri
        self.moved = self.recorded_root is not None and not same_location(self.recorded_root, root)
        self.bases = {
            i: Base(i, b.name, self._now(self.recorded[i]), bool(b.is_dataset_root))
            for i, b in recorded.items()
        }

    def _recorded_root(self, recorded: dict) -> str | None:
        if self.location.branch is not None:
            # Lance gives a branch's manifest base 0: the root of the tree it belongs to
            base = recorded.get(0)
            if base is not None and base.is_dataset_root:
                return self.recorded[0]
        if self.store_id is not None and not self.clone:
            return self.recorded[self.store_id].removesuffix(f"/{STORE_DIR}")
        return None  # no base of its own (or a shallow clone: its bases are the source's)

    def _now(self, uri: str) -> str:
        """``uri`` (a base recorded in the manifest) where it is now."""
        old = self.recorded_root
        if old is None or not self.moved:
            return uri
        if uri == old or uri.startswith(old + "/"):
            return self.location.root_uri + uri[len(old) :]
        return uri

    def get(self, base_id: int) -> Base | None:
        return self.bases.get(base_id)

    @property
    def store(self) -> Base | None:
        """The table's store base, if registered."""
        return None if self.store_id is None else self.bases[self.store_id]

    @property
    def store_moved(self) -> bool:
        """Whether the manifest records the store at another place than the table's own (the
        table was copied or moved; a shallow clone's store is its source's, not moved)."""
        return (
            self.store_id is not None
            and not self.clone
            and not same_location(self.recorded[self.store_id], self.location.store_uri)
        )

    def store_is_own(self) -> bool:
        """Whether the store base names this table's own store (after mapping a move)."""
        store = self.store
        return store is not None and same_location(store.uri, self.location.store_uri)


def is_store_base_name(name: str | None) -> bool:
    """Whether a base path's name is the one blobhouse gives the table's store."""
    return name is not None and (name == STORE_BASE_NAME or name.startswith(STORE_BASE_NAME + "@"))


def same_location(a: str, b: str) -> bool:
    """Whether two URIs or paths name the same place (symlinks and spelling aside)."""
    try:
        return normalize_uri(a).rstrip("/") == normalize_uri(b).rstrip("/")
    except InvalidInputError:
        return a.rstrip("/") == b.rstrip("/")


def manifest_version(name: str) -> int | None:
    """The version a manifest's file name in ``_versions/`` names (None: not a manifest).

    >>> manifest_version("3.manifest"), manifest_version(f"{2**64 - 1 - 3:020}.manifest")
    (3, 3)
    >>> manifest_version("3.manifest.tmp"), manifest_version("d1.manifest")
    (None, None)
    >>> manifest_version(f"{2**64 - 1 - (2**63 + 5):020}.manifest")  # a detached version
    """
    stem = name.removesuffix(".manifest")
    if stem == name or not stem.isdigit():
        return None
    # Lance's V2 naming: u64::MAX - version in 20 digits; V1: the version itself
    version = 2**64 - 1 - int(stem) if len(stem) == 20 else int(stem)
    return None if version >= _DETACHED else version


def manifest_path(dataset_path: str, version: int) -> str:
    """Where Lance's V2 naming scheme (every manifest pylance 12+ writes) puts ``version``'s
    manifest in the dataset at ``dataset_path``.

    >>> manifest_path("/t", 3)
    '/t/_versions/18446744073709551612.manifest'
    """
    return f"{dataset_path.rstrip('/')}/{VERSIONS_DIR}/{2**64 - 1 - version:020d}.manifest"


def transaction_path(dataset_path: str, name: str) -> str:
    """Where Lance keeps the transaction file ``name`` of the dataset at ``dataset_path``."""
    return f"{dataset_path.rstrip('/')}/{TRANSACTIONS_DIR}/{name}"


_DETACHED = 1 << 63  # Lance marks a detached version (on no branch) with the top bit

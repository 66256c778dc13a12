"""Getting a table ready for a write: where it may be made, its store registered and its own,
the properties and allowed bases a write plans by.

Every write, backfill, update, merge and compaction prepares its table here, once, before it
plans (:func:`prepared_for_write`); nothing here writes a data file.
"""

from __future__ import annotations

import contextlib
import itertools
import os
from collections.abc import Sequence
from dataclasses import replace

import lance
import pyarrow as pa
from lance import DatasetBasePath, LanceDataset

from blobhouse.commit.change import commit_once
from blobhouse.errors import (
    BlobhouseError,
    ConcurrentCommitError,
    InvalidInputError,
    PathIsFileError,
    PropertyConflictError,
    TableMetadataError,
)
from blobhouse.io.objects import StorageOptions, is_local, object_store, uri_to_path
from blobhouse.layout import (
    STORE_BASE_NAME,
    BasePaths,
    TableLocation,
    left_by_a_failed_create,
)
from blobhouse.options import WriteOptions
from blobhouse.placement import AllowedBases
from blobhouse.properties import TableProperties, new_table_properties
from blobhouse.snapshot import TableSnapshot, file_in_the_way, open_dataset
from blobhouse.store.packs import store_base, store_base_id
from blobhouse.values import path_name, stored_blob_columns
from blobhouse.write.pipeline import WritePlan


def prepared_for_write(snapshot: TableSnapshot, dedup: str) -> TableSnapshot:
    """The table a change plans against: its store pointed at its own place if the table was
    moved, and registered first (one commit, once) when the change writes with
    ``dedup="global"``."""
    location, options = snapshot.location, snapshot.storage_options
    dataset = relocate_store(snapshot.dataset, location, options)
    if dedup == "global" and store_base_id(dataset) is None:
        dataset, _ = ensure_store(dataset, location, options)
    return snapshot if dataset is snapshot.dataset else snapshot.at(dataset)


#: commits a store registration may lose to other writers before it gives up
REGISTER_ATTEMPTS = 10


def ensure_store(
    dataset: LanceDataset, location: TableLocation, storage_options: StorageOptions | None = None
) -> tuple[LanceDataset, int]:
    """The dataset with its store registered (one extra commit the first time) and the base id.

    >>> import tempfile, pyarrow as pa
    >>> root = tempfile.mkdtemp() + "/t"
    >>> ds = lance.write_dataset(pa.table({"a": [1]}), root)
    >>> ds, base_id = ensure_store(ds, TableLocation(root))
    >>> base_id, store_base_id(ds)
    (1, 1)
    """
    path = location.dataset_path
    for _ in range(REGISTER_ATTEMPTS):
        base_id = store_base_id(dataset)
        if base_id is not None:
            return dataset, base_id
        base = store_base(location, dataset)
        try:
            _commit_bases(dataset, location, [base], storage_options)
        except (OSError, ConcurrentCommitError):
            # another writer changed the table first (maybe registering the store itself):
            # look again at the latest version
            dataset = lance.dataset(path, storage_options=storage_options)
            continue
        return lance.dataset(path, storage_options=storage_options), base.id
    raise BlobhouseError(
        f"could not register the store of {location}: {REGISTER_ATTEMPTS} attempts lost a "
        "commit race with other writers"
    )


def relocate_store(
    dataset: LanceDataset, location: TableLocation, storage_options: StorageOptions | None = None
) -> LanceDataset:
    """The latest version of ``dataset`` with its store base pointing at the table's own store:
    one commit when the table was copied or moved (its manifest still names the old place),
    none otherwise.

    Lance has no operation that changes a base path; registering a base under an id that is
    taken replaces that base (pylance 14's ``UpdateBases``), so the store keeps its id, rows
    keep their references, and the base gets a new name (Lance refuses a name or path twice).
    """
    for _ in range(REGISTER_ATTEMPTS):
        bases = BasePaths(dataset, location)
        if not bases.store_moved:
            return dataset
        taken = {base.name for base in dataset.base_paths().values()}
        name = next(
            f"{STORE_BASE_NAME}@{n}"
            for n in itertools.count(1)
            if f"{STORE_BASE_NAME}@{n}" not in taken
        )
        base = DatasetBasePath(uri_to_path(location.store_path), name=name, id=bases.store_id)
        # on a conflict another writer committed first (maybe relocating too): look again
        with contextlib.suppress(OSError, ValueError, ConcurrentCommitError):
            _commit_bases(dataset, location, [base], storage_options)
        dataset = lance.dataset(location.dataset_path, storage_options=storage_options)
        if not BasePaths(dataset, location).store_moved:
            return dataset
    raise BlobhouseError(
        f"could not point the store of {location} at {location.store_uri}: its manifest still "
        f"names {BasePaths(dataset, location).recorded[bases.store_id]} after "
        f"{REGISTER_ATTEMPTS} attempts"
    )


def _commit_bases(
    dataset: LanceDataset,
    location: TableLocation,
    bases: list[DatasetBasePath],
    storage_options: StorageOptions | None,
) -> None:
    """Register ``bases`` in one commit on ``dataset``'s version, through a transaction (on
    an object of its own: Lance moves the object it changes, and the caller's is a snapshot's)."""
    snapshot = TableSnapshot(dataset, location, storage_options)
    commit_once(snapshot, "store", lambda own: own.add_bases(bases))


# What a new table's folder may hold already: the leftovers of a failed create
# (layout.left_by_a_failed_create).
_SHOWN = 3  # foreign entries named in the error (a listing stops at the next one)


def check_target(
    uri: str, allow_nonempty_folder: bool = False, storage_options: StorageOptions | None = None
) -> None:
    """Refuse a ``uri`` a write cannot make a table at (a file, a folder below a file, a folder
    or prefix of other files), before any work starts (ingest checks it before Spark).

    >>> import tempfile, os
    >>> path = os.path.join(tempfile.mkdtemp(), "rows.jsonl")
    >>> _ = open(path, "w").write("{}")
    >>> check_target(path)
    Traceback (most recent call last):
    ...
    blobhouse.errors.PathIsFileError: cannot create a table at ... it is a file
    """
    location = TableLocation.of(uri, None, storage_options)
    if open_dataset(location, None, storage_options) is None:
        check_new_table_folder(location.root, allow_nonempty_folder, storage_options)


def check_new_table_folder(
    root: str, allow_nonempty_folder: bool, storage_options: StorageOptions | None = None
) -> None:
    """Refuse to create a table at a file, or in a folder (a prefix, on an object store) of
    other files, unless asked: gc sweeps a table's data/, and a user's files there with it."""
    if is_local(root):
        in_the_way = file_in_the_way(uri_to_path(root))
        if in_the_way is not None:
            raise PathIsFileError(f"cannot create a table at {root}: {in_the_way}")
    if allow_nonempty_folder:
        return
    foreign = _foreign_entries(root, storage_options)
    if foreign:
        shown = ", ".join(foreign[:_SHOWN]) + (" and more" if len(foreign) > _SHOWN else "")
        raise InvalidInputError(
            f"{root} is a folder of other files ({shown}): a new table would mix its "
            "_versions/ and data/ into them, and gc would sweep them as its own. Write to a new "
            "or empty folder, or pass allow_nonempty_folder=True (Spark: option "
            "allow_nonempty_folder=true)"
        )


def _foreign_entries(root: str, storage_options: StorageOptions | None) -> list[str]:
    """Up to ``_SHOWN + 1`` of the files (and local symlinks) at ``root`` that are not a failed
    create's leftovers; the listing stops there (a folder of a million files is refused as
    fast as one of four)."""
    found = []
    if is_local(root) and os.path.isdir(uri_to_path(root)):
        # a symlinked entry would lead the table's files, and gc, out of the folder
        found = sorted(e.name for e in os.scandir(uri_to_path(root)) if e.is_symlink())
    for info in object_store(root, storage_options).walk(root):
        if left_by_a_failed_create(info.name):
            continue
        if info.name in found:  # a symlinked file, named already
            continue
        found.append(info.name)
        if len(found) > _SHOWN:
            break
    return found


def with_store(
    location: TableLocation, existing: LanceDataset | None, storage_options: dict[str, str] | None
) -> tuple[LanceDataset | None, int]:
    """The table with its store registered (an existing table gets one commit for it, once),
    and the store's base id; a table being created registers it in its first commit."""
    if existing is None:
        return None, store_base(location, None).id
    existing, base_id = ensure_store(existing, location, storage_options)
    bases = BasePaths(existing, location)
    if not bases.store_is_own():
        raise InvalidInputError(
            f"{location}: the store this table's manifest names ({bases.store.uri}) is not the "
            f"table's own ({location.store_uri}); a shallow clone shares its source's store, "
            "so dedup='global' writes to it are refused"
        )
    return existing, base_id


def remove_empty_local_dirs(*paths: str) -> None:
    """Remove directories a failed create made, if they are local and empty."""
    for path in paths:
        if "://" not in path:
            with contextlib.suppress(OSError):
                os.rmdir(path)


def kept_properties(existing: LanceDataset | None, appending: bool) -> TableProperties:
    """The properties a write plans by: the table's (an overwrite replaces damaged ones; an
    append refuses them, naming every damaged one before anything else reads them)."""
    if existing is None:
        return TableProperties()
    properties = TableProperties.of(existing)
    if appending:
        properties.check_writable()
    return TableProperties() if properties.damaged and not appending else properties


def blob_names(schema: pa.Schema) -> list[str]:
    return [path_name(p) for p in stored_blob_columns(schema)]


def properties_of(plan: WritePlan, options: WriteOptions) -> TableProperties:
    """What a write that makes the table anew records (its bases as the plan checked them)."""
    columns = [(c.name, c.dedup, c.ref_id_column, c.placement) for c in plan.columns]
    properties = new_table_properties(options, columns)
    bases = plan.allowed_bases
    return replace(properties, allowed_bases=tuple(bases.bases), managed_bases=tuple(bases.managed))


def allowed_bases_of(
    existing: LanceDataset | None,
    given: Sequence[str] | None,
    appending: bool,
    root_uri: str,
    managed: Sequence[str] | None = None,
) -> AllowedBases:
    try:
        kept = AllowedBases.of_table(existing.schema if existing is not None else None, root_uri)
    except TableMetadataError:
        if appending:
            raise
        kept = AllowedBases((), root_uri)  # an overwrite replaces damaged metadata
    if given is None and managed is None:
        return kept
    requested = AllowedBases(given or (), root_uri, managed or ())
    if not appending:
        return requested
    # an append may repeat the table's settings (what it gives of them), never change them
    same_allowed = given is None or set(requested.bases) | set(kept.managed) == set(kept.bases)
    if not same_allowed or (managed is not None and requested.managed != kept.managed):
        raise PropertyConflictError(
            "allowed_bases are set when a table is created or overwritten (managed_bases "
            f"too); this table's are {kept.bases} (managed: {kept.managed}), the append asked "
            f"for {requested.bases} (managed: {requested.managed})"
        )
    return kept

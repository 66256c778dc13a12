"""Store packs: payloads back to back under ``_blobs/packs/``, the store's base path in the table's
manifest, and packs retired (tombstoned) and removed."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from lance import DatasetBasePath, LanceDataset

from blobhouse.errors import StoreError, StoreRaceError
from blobhouse.files.session import PreparedBlob
from blobhouse.io.objects import StorageOptions, object_sizes, object_store, uri_to_path
from blobhouse.io.uris import as_uri
from blobhouse.layout import (
    INDEX_DIR,
    INDEX_FILTERS_DIR,
    INDEX_PACK_PATH,
    INDEX_SHARDS_DIR,
    PACKS_DIR,
    STORE_BASE_NAME,
    STORE_DIR,
    TOMBSTONES_DIR,
    TableLocation,
    index_shard_name,
    is_store_base_name,
    store_dir,
)
from blobhouse.placement import Kind

if TYPE_CHECKING:
    pass


@dataclass(frozen=True)
class StoredPayload:
    """One payload in the store: ``size`` bytes at ``position`` of ``pack`` (relative to the
    store directory), whose blake3 is ``digest``."""

    digest: bytes
    pack: str
    position: int
    size: int

    def prepared(self, base_id: int) -> PreparedBlob:
        """The value a row stores to reference this payload (a Lance external blob)."""
        return PreparedBlob(
            Kind.EXTERNAL, size=self.size, position=self.position, uri=self.pack, blob_id=base_id
        )


def inside_the_store(pack: object) -> bool:
    """Whether ``pack`` (an index entry's) is the path of a pack inside the store, as
    blobhouse names them; an entry naming anything else is damaged, never read.

    >>> inside_the_store("packs/write-0a1b-5f.pack"), inside_the_store("packs/../../x.pack")
    (True, False)
    """
    return isinstance(pack, str) and INDEX_PACK_PATH.fullmatch(pack) is not None


def store_base_id(dataset: LanceDataset) -> int | None:
    """The id of the table's store among its Lance base paths (None: no store yet)."""
    for base_id, base in dataset.base_paths().items():
        if is_store_base_name(base.name):
            return base_id
    return None


def store_base(location: TableLocation, existing: LanceDataset | None) -> DatasetBasePath:
    """The base path to register for the store of a table (a fresh id if others exist)."""
    taken = existing.base_paths() if existing is not None else {}
    return DatasetBasePath(
        uri_to_path(location.store_path), name=STORE_BASE_NAME, id=max(taken, default=0) + 1
    )


def store_uri_prefix(table_uri: str) -> str:
    """The prefix resolved references into the table's store start with."""
    return f"{as_uri(store_dir(table_uri))}/"


def remove_packs(
    table_path: str, packs: Iterable[str], storage_options: StorageOptions | None = None
) -> None:
    """Delete store packs (relative to the store directory) that nothing committed uses (best
    effort: gc removes what is left)."""
    uris = [as_uri(f"{store_dir(table_path)}/{pack}") for pack in packs]
    if uris:
        with contextlib.suppress(OSError, StoreError):
            object_store(uris[0], storage_options).delete_many(uris)


def remove_staged_packs(
    table_path: str, name_prefix: str, storage_options: StorageOptions | None = None
) -> None:
    """Delete every pack whose name starts with ``name_prefix`` (what one write staged)."""
    root = as_uri(f"{store_dir(table_path)}/{PACKS_DIR}")
    store = object_store(root, storage_options)
    try:
        listed = store.list(root)
    except OSError:  # cleanup is best effort: gc removes what is left, the cause is raised
        return
    staged = [f"{root}/{info.name}" for info in listed if info.name.startswith(name_prefix)]
    with contextlib.suppress(OSError, StoreError):
        store.delete_many(staged)


def retired_packs(
    table_path: str, storage_options: StorageOptions | None = None
) -> dict[str, float]:
    """Packs gc has retired (tombstoned), with the time each was retired (store clock)."""
    root = as_uri(f"{store_dir(table_path)}/{TOMBSTONES_DIR}")
    listed = object_store(root, storage_options).list(root)
    return {f"{PACKS_DIR}/{info.name}": info.mtime for info in listed if "/" not in info.name}


def tombstone_packs(
    table_path: str, packs: Iterable[str], storage_options: StorageOptions | None = None
) -> None:
    """Tombstone ``packs``: from now on writers pass over their index entries, and a writer
    that found one earlier refuses to commit (see :func:`check_packs_usable`). The index drops
    their entries next (:func:`blobhouse.store.index.retire_packs`)."""
    for pack in packs:
        uri = _tombstone_uri(table_path, pack)
        object_store(uri, storage_options).put(uri, b"")


def forget_tombstones(
    table_path: str, packs: Iterable[str], storage_options: StorageOptions | None = None
) -> None:
    """Take packs back from retirement (a retained version references them after all), or
    forget the tombstones of packs gc deleted."""
    uris = [_tombstone_uri(table_path, pack) for pack in packs]
    if uris:
        with contextlib.suppress(OSError, StoreError):
            object_store(uris[0], storage_options).delete_many(uris)


def _tombstone_uri(table_path: str, pack: str) -> str:
    name = pack.removeprefix(PACKS_DIR + "/")
    return as_uri(f"{store_dir(table_path)}/{TOMBSTONES_DIR}/{name}")


def missing_objects(
    table_path: str, paths: Sequence[str], storage_options: StorageOptions | None
) -> list[str]:
    """Which of ``paths`` (relative to the table) do not exist. On an object store each is a
    request: they run in parallel."""
    root = as_uri(table_path)
    sizes = object_sizes([f"{root}/{p}" for p in paths], storage_options)
    return [p for p, size in zip(paths, sizes, strict=True) if size is None]


def check_packs_usable(
    table_path: str, packs: Iterable[str], storage_options: StorageOptions | None = None
) -> None:
    """Refuse to commit references to packs gc retired or removed while the write ran (the
    write found them in the index earlier); retrying the write stores those payloads anew."""
    packs = set(packs)
    if not packs:
        return
    retired = set(retired_packs(table_path, storage_options)) & packs
    others = sorted(f"{STORE_DIR}/{p}" for p in packs - retired)
    missing = {
        p.removeprefix(f"{STORE_DIR}/")
        for p in missing_objects(table_path, others, storage_options)
    }
    if retired or missing:
        raise StoreRaceError(
            f"store pack(s) {sorted(retired | missing)} were retired by gc while this write ran; "
            "nothing was committed, retry the write (it stores those payloads anew)"
        )


def index_uri(table_path: str) -> str:
    """The store index's level 0 (:mod:`blobhouse.store.index`)."""
    return f"{store_dir(table_path)}/{INDEX_DIR}"


def index_shard_uri(table_path: str, shard: int) -> str:
    """The index shard ``shard`` (:mod:`blobhouse.store.index`)."""
    return f"{store_dir(table_path)}/{INDEX_SHARDS_DIR}/{index_shard_name(shard)}"


def index_shard_filters_uri(table_path: str) -> str:
    """The filters of every index shard, in one folder: one listing finds them all."""
    return f"{store_dir(table_path)}/{INDEX_SHARDS_DIR}/{INDEX_FILTERS_DIR}"

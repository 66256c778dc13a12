"""verify: every blob reference of every retained version resolves to bytes; ``deep`` also checks
the bytes against the content hashes recorded when they were written.

Work is split by :class:`~blobhouse.maintenance.versions.FragmentState` (:func:`verify_state`), so
``blobhouse.spark.verify`` runs the same check with a Spark task per fragment state.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from blobhouse.borrowing import borrowed_by
from blobhouse.commit.runners import Here, Runner, parts_on
from blobhouse.dedup import content_hash
from blobhouse.errors import (
    BlobReadError,
    DataFileError,
    StoreError,
    is_damaged_file_error,
    lance_message,
)
from blobhouse.files.footer import data_file_problem
from blobhouse.files.ranges import BlobRef, RefColumns, read_ranges, refs_from_arrow
from blobhouse.files.references import ResolvedRows
from blobhouse.io.objects import StorageOptions, object_store
from blobhouse.layout import OWNER_DIR
from blobhouse.maintenance.reports import VerifyReport
from blobhouse.maintenance.versions import (
    FragmentState,
    ReferenceBatch,
    VersionGraph,
    fragment_references,
    fragment_states,
    version_of,
)
from blobhouse.managed import Registry
from blobhouse.ownership import read_owners
from blobhouse.placement import MiB
from blobhouse.progress import Amounts, ProgressCallback
from blobhouse.settings import SETTINGS
from blobhouse.snapshot import snapshot_of, table_io
from blobhouse.store.checks import damaged_entries
from blobhouse.store.packs import index_uri, store_uri_prefix

if TYPE_CHECKING:
    from blobhouse.snapshot import TableSnapshot

DEEP_READ_BYTES = 64 * MiB
_OWNERS = ("table", "managed", "unmanaged")  # whose object a problem is about
_MISSING = "missing object"
_MISSING_DATA_FILE = "missing data file"
_DAMAGED_DATA_FILE = "damaged data file"


@dataclass(frozen=True)
class Problem:
    """One stored payload (``uri``, ``position``, ``size``) that does not resolve to the bytes it
    was written with, or one problem of the table as a whole (``rows`` empty).

    ``rows`` are every ``(branch, version, column, row)`` that references the payload
    (``branch`` None: main; ``row`` is the position among that version's rows; a missing data
    file lists the first row of its fragment in each version); ``branch``, ``version``,
    ``column`` and ``row`` repeat the first of them. A payload shared by 60 rows is one problem
    with 60 rows. ``owner`` says whose object it is: ``table`` (its own files and store),
    ``managed`` (an external object handed to the table) or ``unmanaged`` (an external object
    the user owns); empty for a problem of the table as a whole."""

    branch: str | None
    version: int
    column: str
    row: int
    uri: str
    reason: str
    position: int | None = None
    size: int | None = None
    rows: tuple[tuple[str | None, int, str, int], ...] = ()
    owner: str = ""

    def to_dict(self) -> dict:
        """The problem as verify reports it (``references``: how many rows)."""
        return {
            "branch": self.branch,
            "version": self.version,
            "column": self.column,
            "row": self.row,
            "uri": self.uri,
            "reason": self.reason,
            "position": self.position,
            "size": self.size,
            "owner": self.owner,
            "references": len(self.rows),
            "rows": [
                {"branch": branch, "version": version, "column": column, "row": row}
                for branch, version, column, row in self.rows
            ],
        }


@dataclass
class StateReport:
    """What verifying one fragment state found; ``problems`` hold ``(column, row, uri,
    position, size, reason)`` with ``row`` counted among the fragment's live rows (position and
    size None: a missing data file)."""

    references: int = 0
    objects: set[str] = field(default_factory=set)
    hashed: int = 0
    unhashed: int = 0
    problems: list[tuple[str, int, str, int | None, int | None, str]] = field(default_factory=list)
    read_bytes: int = 0  # payload bytes read to be hashed (deep: a range once per run)


class Checker:
    """Object sizes and verified payloads, remembered across fragment states of one run."""

    def __init__(
        self, table: TableSnapshot, damaged: Mapping[tuple[str, int, int], str] | None = None
    ) -> None:
        self.sizes: dict[str, int | None] = {}
        # (pack uri, position, size) of damaged store index entries -> why: their rows are named
        self.damaged = damaged or {}
        self.storage_options = table.storage_options
        self.hashes = table.recorded_hashes(shared=False)  # what the files hold now
        # keyed with the hash it is checked against: a range is judged per expectation
        self.verdicts: dict[tuple[str, int, int, bytes], str | None] = {}
        self.read_bytes = 0  # payload bytes read to be hashed, this run
        # data files whose recorded hashes are damaged, listed once each
        self.unreadable: set[str] = set()
        self.footers: dict[str, str | None] = {}  # data file -> why its footer is damaged

    def data_file_problem(self, uri: str, recorded_size: int | None = None) -> str | None:
        """Why Lance cannot read data file ``uri`` (missing, not the ``recorded_size`` its
        manifest records, or its footer damaged), or None."""
        if self.range_problem(uri, 0, 0):
            return _MISSING_DATA_FILE
        if uri not in self.footers:
            why = data_file_problem(uri, self.storage_options, recorded_size, size=self.sizes[uri])
            self.footers[uri] = None if why is None else f"{_DAMAGED_DATA_FILE}: {why}"
        return self.footers[uri]

    def range_problem(self, uri: str, position: int, size: int) -> str | None:
        if uri not in self.sizes:
            self.sizes[uri] = _object_size(uri, self.storage_options)
        length = self.sizes[uri]
        if length is None:
            return _MISSING
        if position + size > length:
            return f"range [{position}, +{size}) is past the end ({length} bytes)"
        return None

    def recorded_hashes(self, batch: ReferenceBatch) -> list[bytes | None]:
        """The recorded digest of each reference of ``batch`` (None: none recorded)."""
        rows = ResolvedRows(
            RefColumns.of(refs_from_arrow(batch.refs)),
            batch.kinds,
            batch.blob_ids,
            batch.offsets.astype(np.uint64),  # one fragment: its rows' offsets are addresses
        )
        file = batch.data_file
        return self.hashes.expected_many(
            lambda _: batch.file_column, rows, None if file is None else lambda _: file
        )


def verify_state(
    table: TableSnapshot,
    state: FragmentState,
    *,
    deep: bool = False,
    checker: Checker | None = None,
) -> StateReport:
    """Check every reference of one fragment state; ``table`` is opened at ``state.version``."""
    checker = checker or Checker(table)
    report = StateReport()
    # a data file gone or damaged: no row of the fragment can be read
    for uri, size in zip(state.data_files, state.data_file_sizes, strict=True):
        problem = checker.data_file_problem(uri, size)
        if problem:
            reason = f"{problem}: every row of fragment {state.fragment_id} is unreadable"
            report.problems.append(("", 0, uri, None, None, reason))
    if report.problems:
        return report
    read_before = checker.read_bytes
    try:
        _check_references(table, state, deep, checker, report)
        if deep:
            _decode_columns(table, state.fragment_id)
    except DataFileError as exc:  # a blob descriptor that cannot be true, say: the rest go on
        report.problems.append(("", 0, exc.uri, None, None, f"{_DAMAGED_DATA_FILE}: {exc}"))
    except (OSError, ValueError, RuntimeError) as exc:
        if not is_damaged_file_error(exc):
            raise
        # a damaged page: every file's footer is intact, Lance found the damage decoding
        reason = (
            f"{_DAMAGED_DATA_FILE}: {lance_message(exc)}: rows of fragment "
            f"{state.fragment_id} cannot be read"
        )
        report.problems.append(("", 0, " ".join(state.data_files), None, None, reason))
    report.read_bytes = checker.read_bytes - read_before
    return report


def _check_references(
    table: TableSnapshot, state: FragmentState, deep: bool, checker: Checker, report: StateReport
) -> None:
    """Check every blob reference of ``state``'s rows into ``report``."""
    for batch in fragment_references(table, state.fragment_id):
        for row, uri, reason in batch.unresolved:  # reported, and the walk goes on
            report.problems.append((batch.column, row, uri, None, None, _unresolved(reason)))
        uris = batch.refs.field("uri").to_pylist()
        positions = batch.refs.field("position").to_pylist()
        sizes = batch.refs.field("size").to_pylist()
        to_hash: list[tuple[int, BlobRef, bytes]] = []
        recorded = _recorded_or_reported(checker, batch, report) if deep else []
        for i, (uri, position, size) in enumerate(zip(uris, positions, sizes, strict=True)):
            report.references += 1
            report.objects.add(uri)
            entry = checker.damaged.get((uri, position, size))
            if entry is not None:  # the row may be right: the entry naming its bytes is not
                row = int(batch.rows[i])
                report.problems.append((batch.column, row, uri, position, size, entry))
            problem = checker.range_problem(uri, position, size)
            if problem:
                row = int(batch.rows[i])
                report.problems.append((batch.column, row, uri, position, size, problem))
                continue
            if not deep:
                continue
            ref = BlobRef(uri, position, size)
            expected = recorded[i]
            if expected is None:
                report.unhashed += 1
            else:
                to_hash.append((i, ref, expected))
        for i, ref, verdict in _hash_checked(to_hash, checker):
            report.hashed += 1
            if verdict:
                row = int(batch.rows[i])
                report.problems.append(
                    (batch.column, row, ref.uri, ref.position, ref.size, verdict)
                )


def _decode_columns(table: TableSnapshot, fragment_id: int) -> None:
    """Decode every column of one fragment but the blob columns (read as references): Lance
    raises on a page it finds damaged."""
    blob_tops = {path[0] for path in table.blob_paths}
    columns = [name for name in table.schema.names if name not in blob_tops]
    if not columns:
        return
    fragment = table.dataset.get_fragment(fragment_id)
    for _ in table.dataset.scanner(columns=columns, fragments=[fragment]).to_batches():
        pass


def _recorded_or_reported(
    checker: Checker, batch: ReferenceBatch, report: StateReport
) -> list[bytes | None]:
    """The recorded hashes of ``batch``'s references; when the data file holding them is
    damaged, none (its rows are not hashed) and the file listed once as a problem."""
    try:
        return checker.recorded_hashes(batch)
    except BlobReadError as exc:
        if isinstance(exc, StoreError):
            raise  # the store failed the read: nothing is known about the file
        if exc.uri not in checker.unreadable:
            checker.unreadable.add(exc.uri)
            row = int(batch.rows[0]) if len(batch.rows) else 0
            report.problems.append((batch.column, row, exc.uri, None, None, str(exc)))
        return [None] * len(batch.rows)


def _unresolved(reason: str) -> str:
    """Why a reference cannot be resolved, without the row the problem lists anyway."""
    return "unresolvable reference: " + reason.split(": ", 1)[-1]


def _hash_checked(
    items: list[tuple[int, BlobRef, bytes]], checker: Checker
) -> Iterable[tuple[int, BlobRef, str | None]]:
    """Each item with its verdict; each distinct range is read and hashed once per run, in
    coalesced reads of bounded size."""
    pending = [it for it in items if _verdict_key(it[1], it[2]) not in checker.verdicts]
    start = 0
    while start < len(pending):
        end, total = start, 0
        while end < len(pending) and (
            end == start or total + pending[end][1].size <= DEEP_READ_BYTES
        ):
            total += pending[end][1].size
            end += 1
        chunk = pending[start:end]
        for (_, ref, expected), data in zip(chunk, _read_each(chunk, checker), strict=True):
            if isinstance(data, str):  # the object could not be read: reported, walk goes on
                checker.verdicts[_verdict_key(ref, expected)] = data
                continue
            checker.read_bytes += len(data)
            actual = content_hash(data)
            checker.verdicts[_verdict_key(ref, expected)] = (
                None if actual == expected else _mismatch(expected, actual)
            )
        start = end
    for i, ref, expected in items:
        yield i, ref, checker.verdicts[_verdict_key(ref, expected)]


def _mismatch(expected: bytes, actual: bytes) -> str:
    """A content hash mismatch, each digest shown to 8 hex digits past where they differ (a
    damaged recorded hash may differ from the bytes' only late)."""
    recorded, read = expected.hex(), actual.hex()
    differ = next(i for i, (a, b) in enumerate(zip(recorded, read, strict=True)) if a != b)
    shown = max(16, differ + 8)
    return (
        f"content hash mismatch (recorded {recorded[:shown]}, read {read[:shown]}): the bytes, "
        "or the hash recorded in the row's data file, are damaged"
    )


def _read_each(chunk: list[tuple[int, BlobRef, bytes]], checker: Checker) -> list[bytes | str]:
    """The bytes of each item's range, read together; when that fails, one by one, with why
    a range could not be read in place of its bytes."""
    refs = [item[1] for item in chunk]
    try:
        return read_ranges(refs, storage_options=checker.storage_options)
    except (BlobReadError, OSError) as exc:
        if len(refs) == 1:
            return [f"unreadable object: {str(exc).splitlines()[0]}"]
    return [_read_each([item], checker)[0] for item in chunk]


def _verdict_key(ref: BlobRef, expected: bytes) -> tuple[str, int, int, bytes]:
    return (ref.uri, ref.position, ref.size, expected)


@table_io("verify", reads_only=True)
def verify(
    table: TableSnapshot,
    graph: VersionGraph | None = None,
    *,
    deep: bool = False,
    progress: ProgressCallback | None = None,
    runner: Runner | None = None,
) -> VerifyReport:
    """Check that every blob reference of every retained version of every branch (or of the
    versions of ``graph``) resolves to an existing object with its range inside it; ``deep`` also
    re-hashes every stored payload against the blake3 recorded at write time. A problem is one
    stored payload (uri, position, size) and the reason, with every row that references it
    (``rows``: branch, version, column, row as the position among that version's rows;
    ``references``: how many), the first of them repeated as ``branch``, ``version``,
    ``column`` and ``row``: a damaged payload 60 rows share is one problem. A table copied
    or moved whose manifest still names its old place is a problem too (blobhouse reads it
    right; stock Lance readers would follow the old path until ``relocate``), and so is a
    branch that cannot be read where the table is now. Each problem names the ``owner`` of its
    object, and ``missing_objects`` counts the missing ones apart: the table's own files,
    managed external objects, unmanaged (user-owned) external objects.

    >>> import tempfile, pyarrow as pa
    >>> from blobhouse import blob_array, write_table
    >>> t = write_table(pa.table({"img": blob_array([b"x" * 100_000])}), tempfile.mkdtemp() + "/t")
    >>> report = verify(t, deep=True)
    >>> report["problems"], report["hashed"]
    ([], 1)
    """
    deep = SETTINGS["deep"].check(deep)
    table = snapshot_of(table)
    graph = graph or VersionGraph.of(table)
    states = sorted(fragment_states(table, list(graph.versions)), key=_in_version_order)
    damaged = damaged_store_entries(table, runner) if deep else {}
    checkers: list[Checker] = []  # one per process: sizes and verdicts remembered across states

    # payload bytes each state's check read, for progress (by the state object: the runner
    # hands the same one to the check and to the measure)
    read: dict[int, int] = {}

    def verified(at: TableSnapshot, state: FragmentState) -> StateReport:
        if not checkers:
            checkers.append(Checker(at, damaged))
        report = verify_state(at, state, deep=deep, checker=checkers[0])
        read[id(state)] = report.read_bytes
        return report

    def measure(state: FragmentState) -> Amounts:
        """The bytes verify read for ``state``: its data files, and (deep) the payloads hashed."""
        return state.amounts() + Amounts(bytes=read.pop(id(state), 0))

    runner = runner or Here(progress)
    reports = runner.map(table, verified, states, "verify", where=version_of, measure=measure)
    return summarize(table, graph, zip(states, reports, strict=True), deep=deep, damaged=damaged)


def _in_version_order(state: FragmentState) -> tuple[tuple[str, int], int]:
    return (state.ref.sort_key(), state.fragment_id)


def damaged_store_entries(
    table: TableSnapshot, runner: Runner | None = None
) -> dict[tuple[str, int, int], str]:
    """The store index entries whose bytes are not what their key says, by the range they
    name (pack uri, position, size) -> the reason (what ``verify(deep=True)`` reports), each
    part of the index a unit of ``runner``; a part that cannot be read, as one problem."""
    prefix = store_uri_prefix(table.uri)
    root, options = table.location.root, table.storage_options
    found, unreadable = damaged_entries(root, options, parts_on(runner, table))
    damaged = {(f"{prefix}{d.entry.pack}", d.entry.position, d.entry.size): d.reason for d in found}
    if unreadable:  # reported with what was checked; the walk goes on
        damaged[(index_uri(table.uri), 0, 0)] = unreadable[0]
    return damaged


def summarize(
    table: TableSnapshot,
    graph: VersionGraph,
    reports: Iterable[tuple[FragmentState, StateReport]],
    *,
    deep: bool,
    damaged: Mapping[tuple[str, int, int], str] | None = None,
) -> VerifyReport:
    """One verify report from the reports of fragment states (each counted per version); the
    problems of one stored payload, however many rows and versions reference it, are one
    problem listing those rows."""
    checked = hashed = unhashed = 0
    objects: set[str] = set()
    by_payload: dict[tuple, list[tuple[str | None, int, str, int]]] = {}
    for state, report in reports:
        objects |= report.objects
        copies = len(state.appearances)
        checked += report.references * copies
        hashed += report.hashed * copies
        unhashed += report.unhashed * copies
        for column, row, uri, position, size, reason in report.problems:
            rows = by_payload.setdefault((uri, position, size, reason), [])
            rows.extend(
                (ref.branch, ref.version, column, first_row + row)
                for ref, first_row in state.appearances
            )
    problems: list[Problem] = []
    owner = _owners(table)
    for (uri, position, size, reason), rows in by_payload.items():
        rows.sort(key=lambda r: (r[0] or "", r[1], r[2], r[3]))
        branch, version, column, row = rows[0]
        problems.append(
            Problem(
                branch, version, column, row, uri, reason, position, size, tuple(rows), owner(uri)
            )
        )
    referenced = {(uri, position, size) for uri, position, size, _ in by_payload}
    latest = graph.versions[-1].version if graph.versions else table.version
    problems.extend(  # damaged entries no row references: named all the same
        Problem(None, latest, "", 0, uri, reason, position, size, (), "table")
        for (uri, position, size), reason in (damaged or {}).items()
        if (uri, position, size) not in referenced
    )
    missing = {name: set() for name in _OWNERS}
    for problem in problems:
        if problem.reason == _MISSING or problem.reason.startswith(_MISSING_DATA_FILE):
            missing[problem.owner].add(problem.uri)
    problems.extend(_placement_problems(table, graph))
    problems.extend(_ownership_problems(table, objects, latest, owner))
    problems.extend(
        Problem(branch, 0, "", 0, "", f"branch not verified: {reason}")
        for branch, reason in graph.unreadable
    )
    versions = graph.versions
    problems.sort(key=lambda p: (p.branch or "", p.version, p.column, p.row))
    branches: dict[str, list[int]] = {}
    for ref in versions:
        if ref.branch is not None:
            branches.setdefault(ref.branch, []).append(ref.version)
    return {
        "versions": [ref.version for ref in versions if ref.branch is None],
        "branches": branches,
        "tags": table.tags(),
        "deep": deep,
        "references": checked,
        "objects": len(objects),
        "hashed": hashed,
        "unhashed": unhashed,
        "missing_objects": {name: len(uris) for name, uris in missing.items()},
        "problems": [p.to_dict() for p in problems],
    }


def _owners(table: TableSnapshot) -> Callable[[str], str]:
    """uri -> whose object it is (:data:`_OWNERS`): the table's files (its own directories,
    its store), managed external objects (the registry), unmanaged ones (the rest)."""
    own = f"{table.uri}/"
    registered = Registry.load(table.location, table.storage_options).uris

    def owner(uri: str) -> str:
        if uri.startswith(own):
            return "table"
        return "managed" if uri in registered else "unmanaged"

    return owner


def _placement_problems(table: TableSnapshot, graph: VersionGraph) -> list[Problem]:
    """Where a branch's manifests name the store at another table's place: the table was copied
    or moved, and stock Lance readers of those versions read the other table's store. The
    latest version tells whether to relocate; the oldest retained one whether older versions
    still name the old place (Lance keeps each version's base paths: relocating fixes the
    versions from then on). Two manifests a branch: reading every version's would make verify
    quadratic in a history of appends."""
    problems = []
    by_branch: dict[str | None, list[int]] = {}
    for ref in graph.versions:  # in order
        by_branch.setdefault(ref.branch, []).append(ref.version)
    for branch, versions in by_branch.items():
        latest = table.on_version(branch, versions[-1]).moved_from
        if latest is not None:
            reason = (
                f"the table was copied or moved from {latest}; blobhouse reads its own files, "
                "but stock Lance readers follow the store path in the manifest until "
                f"`blobhouse relocate {table.location.root}` (or any blobhouse write) points "
                "it here"
            )
            problems.append(Problem(branch, versions[-1], "", 0, latest, reason))
        oldest = table.on_version(branch, versions[0]).moved_from if len(versions) > 1 else None
        if oldest is not None:
            reason = (
                f"version {versions[0]} and the versions after it up to a relocation name the "
                f"store at {oldest} (the table was copied or moved since): blobhouse reads them "
                "here, stock Lance readers of those versions read that table's store and fail "
                "once it is gone (a manifest keeps its base paths: relocating fixes the "
                "versions from then on); drop them when no longer needed (gc retain_versions "
                "/ older_than)"
            )
            problems.append(Problem(branch, versions[0], "", 0, oldest, reason))
    return problems


def _ownership_problems(
    table: TableSnapshot, objects: Iterable[str], version: int, owner_of: Callable[[str], str]
) -> list[Problem]:
    """External objects this table references whose owner marker names another table (the
    table was copied from it, say): that table's gc deletes them once it no longer references
    them. One listing per folder of external objects finds the markers there."""
    own = f"{table.uri}/"
    by_folder: dict[str, list[str]] = {}
    for uri in objects:
        if not uri.startswith(own) and "/" in uri:
            by_folder.setdefault(uri.rsplit("/", 1)[0], []).append(uri)
    marked = []
    for folder, uris in sorted(by_folder.items()):
        markers = f"{folder}/{OWNER_DIR}"
        try:
            names = {
                info.name for info in object_store(markers, table.storage_options).walk(markers)
            }
        except (OSError, StoreError):  # no folder to list: no marker
            continue
        marked += [u for u in sorted(uris) if f"{u.rsplit('/', 1)[1]}.json" in names]
    problems = []
    owners = {
        uri: owner
        for uri, owner in read_owners(marked, table.storage_options).items()
        if owner.table is not None and not owner.is_table(table.location)
    }
    borrowed = borrowed_by(table.location, owners, table.storage_options)
    for uri, owner in owners.items():
        if uri in borrowed:
            reason = (
                f"an external object this table references is owned by {owner.describe()}; "
                "this table borrowed it (relocate), so that table's gc keeps it while this "
                "table exists, but this table depends on it: write the object anew here for "
                "this table to stand alone"
            )
        else:
            reason = (
                f"an external object this table references is owned by {owner.describe()}, "
                "whose gc deletes it once that table no longer references it (this table was "
                "copied from it?): run `blobhouse relocate` on this table to borrow it (that "
                "table's gc then keeps it), or write the object anew here"
            )
        problems.append(Problem(None, version, "", 0, uri, reason, owner=owner_of(uri)))
    return problems


def _object_size(uri: str, storage_options: StorageOptions | None) -> int | None:
    try:
        return object_store(uri, storage_options).size(uri)
    except (OSError, ValueError):
        return None

"""The whole version graph: branches (``tree/<name>``, reading their parent's files through base
path 0) and tags. gc never deletes what a branch or a tagged version references, tags never
make it fail, and every service works on a branch as Lance does."""

from __future__ import annotations

import os
from datetime import timedelta

import lance
import pyarrow as pa
import pytest

from blobhouse import InvalidInputError, TableNotFoundError, blob_array, open_table, write_table
from tests.helpers import stock_read

SHARED = os.urandom(200_000)


def rows(ids: range, payloads: list[bytes]) -> pa.Table:
    return pa.table({"id": pa.array(list(ids), pa.int64()), "b": blob_array(payloads)})


def build(uri: str, dedup: str) -> dict[int, bytes]:
    """Three appends sharing one payload; returns id -> bytes."""
    content = {}
    for start in (0, 3, 6):
        payloads = [SHARED, os.urandom(120_000), os.urandom(500)]
        write_table(rows(range(start, start + 3), payloads), uri, mode="append", dedup=dedup)
        content.update(zip(range(start, start + 3), payloads, strict=True))
    return content


def read_all(table) -> dict[int, bytes]:
    return {r["id"]: r["b"] for r in table.to_arrow(blobs="bytes").to_pylist()}


def stock_branch(uri: str, branch: str) -> dict[int, bytes]:
    ids = lance.dataset(f"{uri}/tree/{branch}").to_table(columns=["id"])["id"].to_pylist()
    return dict(zip(ids, stock_read(f"{uri}/tree/{branch}", "b"), strict=True))


@pytest.mark.parametrize("dedup", ["global", "content"])
def test_gc_on_main_keeps_everything_a_branch_references(table_uri, dedup):
    content = build(table_uri, dedup)
    branch = lance.dataset(table_uri).create_branch("exp", 3)
    branch.optimize.compact_files()  # the branch's own files, copying store refs as they are
    # payloads only the branch references (in the store, with global dedup)
    extra = {9: os.urandom(90_000), 10: SHARED}
    write_table(
        rows(range(9, 11), list(extra.values())),
        table_uri,
        mode="append",
        dedup=dedup,
        branch="exp",
    )
    content.update(extra)
    # main drops every row, compacts and collects with no grace, twice
    main = open_table(table_uri)
    main.delete("id >= 0")
    open_table(table_uri).compact()
    for _ in range(2):
        report = open_table(table_uri).gc(retain_versions=1, grace=timedelta(0))
        assert report["removed_files"] >= 0
    assert open_table(table_uri).count_rows() == 0
    exp = open_table(table_uri, branch="exp")
    assert read_all(exp) == content
    assert stock_branch(table_uri, "exp") == content
    verified = open_table(table_uri).verify(deep=True)
    assert verified["problems"] == [] and verified["branches"]["exp"]
    assert verified["hashed"] > 0


def test_a_branch_reading_its_parents_files_opens_and_reads(table_uri):
    content = build(table_uri, "content")
    lance.dataset(table_uri).create_branch("exp", 3)
    for table in (
        open_table(table_uri, branch="exp"),
        open_table(f"{table_uri}/tree/exp"),  # the branch's directory names the branch too
    ):
        assert table.branch == "exp"
        assert read_all(table) == content
        assert table.read_blobs("b", [0, 3]) == [SHARED, SHARED]
        with table.open_blob("b", 1) as f:
            assert f.read() == content[1]
        assert table.stats()["rows"] == 9


def test_every_service_works_on_a_branch(table_uri):
    content = build(table_uri, "content")
    main_before = dict(content)
    lance.dataset(table_uri).create_branch("exp", 3)
    write_table(rows(range(9, 11), [SHARED, b"x" * 70_000]), table_uri, mode="append", branch="exp")
    branch = open_table(table_uri, branch="exp")
    branch.delete("id = 4")
    content.update({9: SHARED, 10: b"x" * 70_000})
    del content[4]
    report = open_table(table_uri, branch="exp").compact()
    assert report["fragments_removed"] == 4
    after = open_table(table_uri, branch="exp")
    assert read_all(after) == content and stock_branch(table_uri, "exp") == content
    # blobhouse's compaction of the branch writes into the branch's directory
    assert any(
        n.startswith("compact-") for n in os.listdir(os.path.join(table_uri, "tree", "exp", "data"))
    )
    assert after.stats()["columns"]["b"]["physical_bytes"] < sum(map(len, content.values()))
    collected = after.gc(retain_versions=1, grace=timedelta(0))
    assert collected["branch"] == "exp" and collected["retained_versions"] == [after.version]
    assert read_all(open_table(table_uri, branch="exp")) == content
    # main is untouched by all of it
    assert read_all(open_table(table_uri)) == main_before
    assert open_table(table_uri, branch="exp").verify(deep=True)["problems"] == []


def test_tags_never_make_gc_fail_and_tagged_versions_stay_readable(table_uri):
    build(table_uri, "global")
    tagged = read_all(open_table(table_uri, 2))
    lance.dataset(table_uri).tags.create("gold", 2)
    open_table(table_uri).delete("id < 6")
    open_table(table_uri).compact()
    report = open_table(table_uri).gc(retain_versions=1, grace=timedelta(0))
    assert 2 in report["retained_versions"] and report["kept_tagged_versions"] == [2]
    assert 1 in report["removed_versions"]
    by_tag = open_table(table_uri, "gold")
    assert by_tag.version == 2 and read_all(by_tag) == tagged
    stock = lance.dataset(table_uri, version="gold")
    ids = stock.to_table(columns=["id"])["id"].to_pylist()
    pairs = stock.read_blobs("b", indices=list(range(len(ids))), preserve_order=True)
    assert dict(zip(ids, [p for _, p in pairs], strict=True)) == tagged
    assert open_table(table_uri).verify(deep=True)["problems"] == []


def test_a_tag_on_a_branch_opens_that_branch(table_uri):
    content = build(table_uri, "content")
    branch = lance.dataset(table_uri).create_branch("exp", 3)
    branch.tags.create("exp-start", ("exp", 3))
    write_table(rows(range(9, 10), [b"new"]), table_uri, mode="append", branch="exp")
    table = open_table(table_uri, "exp-start")
    assert (table.branch, table.version) == ("exp", 3)
    assert read_all(table) == content
    assert open_table(table_uri, "exp-start", branch="exp").version == 3
    with pytest.raises(InvalidInputError, match="points into 'exp'"):
        open_table(table_uri, "exp-start", branch="other")


def test_missing_versions_tags_and_branches_are_named(table_uri):
    build(table_uri, "content")
    with pytest.raises(TableNotFoundError, match="no tag 'nope'"):
        open_table(table_uri, "nope")
    with pytest.raises(TableNotFoundError, match="branch 'nope'"):
        open_table(table_uri, branch="nope")
    with pytest.raises(TableNotFoundError, match="version 99"):
        open_table(table_uri, 99)
    with pytest.raises(TableNotFoundError, match="no branch 'nope'"):
        write_table(rows(range(1), [b"x"]), table_uri, mode="append", branch="nope")


def test_the_command_line_on_tags_and_branches(table_uri, capsys):
    from blobhouse.cli import main

    build(table_uri, "global")
    lance.dataset(table_uri).tags.create("gold", 1)
    lance.dataset(table_uri).create_branch("exp", 2)
    open_table(table_uri).delete("id < 3")
    assert main(["gc", table_uri, "--retain-versions", "1", "--grace-hours", "0"]) == 0
    # the tagged version and the one the branch was made from; never Lance's tag error
    assert "pinned versions 1-2\n" in capsys.readouterr().out
    assert main(["stats", table_uri, "--branch", "exp", "--json"]) == 0
    assert '"rows": 6' in capsys.readouterr().out
    assert main(["verify", table_uri, "--deep"]) == 0
    assert "versions 1-2, 4; branch exp versions 2; 3 objects" in capsys.readouterr().out


def test_spark_reads_a_branch_and_a_tag(spark, table_uri):
    content = build(table_uri, "content")
    lance.dataset(table_uri).tags.create("gold", 2)
    lance.dataset(table_uri).create_branch("exp", 3)
    write_table(rows(range(9, 10), [b"only-on-exp"]), table_uri, mode="append", branch="exp")

    def reader():  # a DataFrameReader keeps the options it was given: one per read
        return spark.read.format("blobhouse").option("blobs", "bytes")

    on_branch = reader().option("branch", "exp").load(table_uri).collect()
    assert {r.id: r.b for r in on_branch} == {**content, 9: b"only-on-exp"}
    tagged = reader().option("version", "gold").load(table_uri).collect()
    assert {r.id: r.b for r in tagged} == {i: content[i] for i in range(6)}


def test_gc_and_stats_survive_a_kept_version_whose_files_lance_removed(table_uri):
    """Measured on pylance 14: with an index, once a branch no longer needs its parent's
    files, Lance's cleanup on main deletes the data files of the version the branch was made
    from but keeps that version. gc and stats go on (keeping what that version may reference:
    the sidecars of its missing files and the whole store), verify names the missing files."""
    content = build(table_uri, "global")
    lance.dataset(table_uri).create_scalar_index("id", "BTREE")
    parent = lance.dataset(table_uri).version
    lance.dataset(table_uri).create_branch("exp", parent)
    open_table(table_uri).delete("id % 3 = 0")
    open_table(table_uri).compact()
    open_table(table_uri).gc(retain_versions=1, grace=timedelta(0))
    open_table(table_uri, branch="exp").delete("id % 4 = 0")
    open_table(table_uri, branch="exp").compact()
    open_table(table_uri, branch="exp").gc(retain_versions=1, grace=timedelta(0))
    lance.dataset(table_uri).cleanup_old_versions(older_than=timedelta(0), retain_versions=1)
    kept = lance.dataset(table_uri, version=parent)
    missing = [
        f.path
        for fragment in kept.get_fragments()
        for f in fragment.data_files()
        if not os.path.exists(os.path.join(table_uri, "data", f.path))
    ]
    assert missing  # Lance's doing: the premise of this test
    report = open_table(table_uri).gc(retain_versions=1, grace=timedelta(0))
    assert "_blobs/packs/" in report["kept_unreadable"] and report["reaped_packs"] == 0
    assert open_table(table_uri).stats()["rows"] == 6
    assert read_all(open_table(table_uri)) == {i: v for i, v in content.items() if i % 3}
    branch = {i: v for i, v in content.items() if i % 4}
    assert read_all(open_table(table_uri, branch="exp")) == branch
    problems = open_table(table_uri).verify()["problems"]
    assert {p["reason"].split(":")[0] for p in problems} == {"missing data file"}
    assert {p["version"] for p in problems} == {parent}


def test_branch_names_as_lance_spells_them(table_uri):
    content = build(table_uri, "content")
    lance.dataset(table_uri).create_branch("team/relabel", 3)
    for table in (
        open_table(table_uri, branch="team/relabel"),
        open_table(f"{table_uri}/tree/team/relabel"),  # Lance records it as team%2Frelabel
    ):
        assert table.branch == "team/relabel" and read_all(table) == content
        assert table.stats()["rows"] == 9
    for bad in ("exp/", "/exp", "a//b", "a b", ""):
        with pytest.raises(InvalidInputError, match="branch must be a branch name"):
            open_table(table_uri, branch=bad)
    assert open_table(table_uri, branch="main").branch is None


def test_retention_arguments_are_checked_and_the_table_left_alone(table_uri):
    build(table_uri, "content")
    lance.dataset(table_uri).tags.create("7", 2)  # a tag that looks like a version number
    assert open_table(table_uri, "7").version == 2 and open_table(table_uri, "3").version == 3
    bad = [
        {"retain_versions": 0},
        {"retain_versions": -1},
        {"retain_versions": "2"},
        {"retain_versions": True},
        {"grace": 5},
        {"grace": timedelta(hours=-1)},
        {"older_than": timedelta(days=-1)},
    ]
    for kwargs in bad:
        name = next(iter(kwargs))
        with pytest.raises(InvalidInputError, match=name):
            open_table(table_uri).gc(**kwargs)
    assert [v["version"] for v in open_table(table_uri).versions()] == [1, 2, 3]
    for version in (0, 2**70, 1.5, True):
        with pytest.raises(InvalidInputError, match="version"):
            open_table(table_uri, version)


def test_walking_a_long_history_of_appends_does_not_resolve_every_version(table_uri, monkeypatch):
    """Each append adds a version whose manifest lists every fragment so far: verify, gc and
    stats read what each version appended from its transaction, place data files and open
    fragment states once, not once per version (that was quadratic: 1,000 appends took ~20 s to
    verify), and keep the versions a fragment is in as runs, not an entry per version."""
    from blobhouse.files.references import ReferenceResolver
    from blobhouse.maintenance.versions import VersionGraph, fragment_states
    from blobhouse.snapshot import TableSnapshot

    built = []
    real_init = ReferenceResolver.__init__

    def counted(self, *args, **kwargs):  # the real resolver, counted
        built.append(1)
        real_init(self, *args, **kwargs)

    monkeypatch.setattr(ReferenceResolver, "__init__", counted)
    opened = []
    real_checkout = TableSnapshot.checkout
    monkeypatch.setattr(
        TableSnapshot,
        "checkout",
        lambda self, *a, **k: opened.append(1) or real_checkout(self, *a, **k),
    )
    resolvers, appended = {}, 0
    for appends in (3, 12):
        for i in range(appended, appends):
            write_table(rows(range(i, i + 1), [os.urandom(100)]), table_uri, mode="append")
        appended = appends
        table = open_table(table_uri)
        opened.clear()
        states = fragment_states(table.snapshot, list(VersionGraph.of(table.snapshot).versions))
        # versions 2.. append to the one before: their transactions say what, and only the
        # first version's manifest (and the latest, the table itself) is read
        assert len(opened) == 2
        assert len(states) == appends
        assert {s.ref.version for s in states} == {table.version}  # opened at the latest
        # each fragment is in every version since its append, at the same row: one run each,
        # however many versions (memory flat as versions grow)
        assert [s.appearances.runs for s in states] == [
            ((None, v, appends, v - 1),) for v in range(1, appends + 1)
        ]
        built.clear()
        report = table.verify()
        # version v holds v one-row fragments
        assert report["problems"] == [] and report["references"] == appends * (appends + 1) // 2
        resolvers[appends] = len(built)
    assert resolvers[12] == resolvers[3] <= 3


def every_manifest(table) -> set[tuple]:
    """(version, fragment id, data files, first row) of every fragment of every version, read
    from each version's manifest: what the walk must find however it reads them."""
    from blobhouse.maintenance.versions import VersionGraph, open_version

    found = set()
    for ref in VersionGraph.of(table).versions:
        at, first_row = open_version(table, ref), 0
        for fragment in at.dataset.get_fragments():
            metadata = fragment.metadata
            files = tuple(at.data_file_uri(f) for f in metadata.files)
            found.add((str(ref), metadata.id, files, first_row))
            first_row += metadata.num_rows
    return found


def walked(states) -> set[tuple]:
    return {
        (str(ref), s.fragment_id, s.data_files, row) for s in states for ref, row in s.appearances
    }


def mixed_history(uri: str) -> None:
    """Appends between every other kind of commit: deletes, updates, compaction, a tag, gc
    leaving a gap in the versions, a branch with appends of its own."""
    ids = iter(range(10_000))

    def append(n: int, **kwargs) -> None:
        batch = rows([next(ids) for _ in range(n)], [os.urandom(300) for _ in range(n)])
        write_table(batch, uri, mode="append", dedup="off", **kwargs)

    for n in (3, 2, 1, 4):
        append(n)
    open_table(uri).delete("id = 1")
    append(2)
    append(1)
    lance.dataset(uri).update({"id": "id + 1000"}, where="id = 4")
    append(2)
    lance.dataset(uri).tags.create("kept", 3)
    open_table(uri).compact()
    for n in (1, 2, 3):
        append(n)
    open_table(uri).gc(retain_versions=2, grace=timedelta(0))
    for n in (2, 1):
        append(n)
    lance.dataset(uri).create_branch("exp", open_table(uri).version)
    for n in (1, 3):
        append(n, branch="exp")
    append(2)


def test_a_walk_through_append_transactions_finds_what_every_manifest_lists(table_uri):
    from blobhouse.maintenance.versions import VersionGraph, fragment_states

    mixed_history(table_uri)
    table = open_table(table_uri)
    # the graph lists manifests; Lance's versions() reads each of them
    graph = VersionGraph.of(table).versions
    for branch, dataset in ((None, lance.dataset(table_uri)), ("exp", table_uri + "/tree/exp")):
        dataset = lance.dataset(dataset) if isinstance(dataset, str) else dataset
        listed = [ref.version for ref in graph if ref.branch == branch]
        assert listed == [v["version"] for v in dataset.versions()]
    expected = every_manifest(table)
    versions = {v for v, *_ in expected}
    # the tagged version, a gap gc left, and the branch are walked
    assert "main@3" in versions and "main@4" not in versions and "exp@17" in versions
    states = fragment_states(table)
    assert walked(states) == expected
    # each state is opened at a version that holds it
    assert {(str(s.ref), s.fragment_id, s.data_files) for s in states} <= {
        (v, fid, files) for v, fid, files, _ in expected
    }
    assert table.verify(deep=True)["problems"] == []


def test_an_append_transaction_the_manifest_contradicts_is_not_trusted(table_uri, monkeypatch):
    """The last manifest of a run of appends must list what their transactions say was
    appended; where it does not, the run's versions are read one by one."""
    from blobhouse.maintenance import versions as walk

    mixed_history(table_uri)
    table = open_table(table_uri)
    real = walk._appended

    def nothing_on_even_versions(dataset, version):  # Lance's transaction, or a false one
        written = real(dataset, version)
        return [] if written and version % 2 == 0 else written

    monkeypatch.setattr(walk, "_appended", nothing_on_even_versions)
    assert walked(walk.fragment_states(table)) == every_manifest(table)


def lance_appended(dataset: lance.LanceDataset, version: int):
    """What Lance's own ``read_transaction`` says ``version`` appended (None: not an append)."""
    from blobhouse.files.references import file_path

    operation = dataset.read_transaction(version).operation
    if not isinstance(operation, lance.LanceOperation.Append):
        return None
    return [
        (tuple((file_path(f), f.base_id) for f in fragment.files), fragment.physical_rows)
        for fragment in operation.fragments
    ]


def test_transaction_files_read_without_lance_say_what_lance_says(table_uri):
    """Each version's transaction, read from its manifest's last bytes and its transaction
    file (a constant cost a version), equals what Lance's read_transaction says (which decodes
    the whole manifest), for appends, deletes, updates, compaction and a branch's appends."""
    from blobhouse.files.transactions import appended

    mixed_history(table_uri)
    lance.dataset(table_uri).update({"id": "id + 5000"}, where="id = 2")
    open_table(table_uri).compact()
    write_table(rows(range(9000, 9001), [os.urandom(100)]), table_uri, mode="append")
    kinds = set()
    for uri in (table_uri, f"{table_uri}/tree/exp"):
        dataset = lance.dataset(uri)
        versions = [v["version"] for v in dataset.versions()]
        said = {v: appended(uri, v) for v in versions[1:]}
        assert said == {v: lance_appended(dataset, v) for v in versions[1:]}
        kinds |= {written is not None for written in said.values()}
    assert kinds == {True, False}  # appends and other commits


def test_a_walk_of_appends_never_asks_lance_for_a_transaction(table_uri, monkeypatch):
    from blobhouse.maintenance.versions import fragment_states

    for i in range(6):
        write_table(rows(range(i, i + 1), [os.urandom(100)]), table_uri, mode="append")
    asked = []
    real = lance.LanceDataset.read_transaction
    monkeypatch.setattr(
        lance.LanceDataset,
        "read_transaction",
        lambda self, version: asked.append(version) or real(self, version),
    )
    table = open_table(table_uri)
    assert walked(fragment_states(table)) == every_manifest(table)
    assert asked == []


def test_a_transaction_name_shaped_value_in_the_table_config_is_not_taken(table_uri):
    """A table config value shaped like a transaction file's name (framed as the manifest's
    field 12, and written after it) is never taken for the version's transaction file."""
    from blobhouse.files.transactions import appended, transaction_name

    for i in range(2):
        write_table(rows(range(i, i + 1), [os.urandom(100)]), table_uri, mode="append")
    real = transaction_name(table_uri, 2)
    fake = "1-00000000-0000-4000-8000-000000000000.txn"
    lance.dataset(table_uri).update_config({"note": "b" + chr(len(fake)) + fake})
    write_table(rows(range(2, 3), [os.urandom(100)]), table_uri, mode="append")
    version = lance.dataset(table_uri).version
    named = transaction_name(table_uri, version)
    assert named != fake and named.endswith(".txn") and real != named
    assert appended(table_uri, version) == lance_appended(lance.dataset(table_uri), version)


def test_an_unreadable_transaction_is_asked_of_lance(table_uri):
    """A transaction file gone, or a manifest whose last bytes name none, raises
    UnreadTransaction (the walk then asks Lance, and still finds every version's fragments)."""
    from blobhouse.files.transactions import UnreadTransaction, appended, transaction_name
    from blobhouse.maintenance.versions import fragment_states

    for i in range(4):
        write_table(rows(range(i, i + 1), [os.urandom(100)]), table_uri, mode="append")
    os.remove(f"{table_uri}/_transactions/{transaction_name(table_uri, 3)}")
    with pytest.raises(UnreadTransaction, match="_transactions"):
        appended(table_uri, 3)
    with pytest.raises(UnreadTransaction, match="no manifest"):
        appended(table_uri, 99)
    table = open_table(table_uri)
    assert walked(fragment_states(table)) == every_manifest(table)


def test_a_name_shaped_string_that_is_not_a_top_level_field_is_passed_over():
    """Bytes shaped like the manifest's transaction_file field inside another field are taken
    only if the fields from them parse to the message's exact end: a field running past it
    rules them out, and the real field is found."""
    import struct

    from blobhouse.files.transactions import UnreadTransaction, _named

    def framed(number: int, value: bytes) -> bytes:
        return bytes([number << 3 | 2, len(value)]) + value

    real, fake = (f"{v}-00000000-0000-4000-8000-00000000000{v}.txn".encode() for v in (7, 3))
    message = (
        framed(5, framed(12, fake) + b"\x12\x7f")  # inside field 5; then a field too long
        + framed(12, real)
        + framed(13, b"lance")
    )
    file = struct.pack("<I", len(message)) + message + struct.pack("<qHH", 0, 0, 2) + b"LANC"
    assert _named(file, 0, len(file)) == real.decode()
    cut = file[:4] + message[: len(message) - 7 - 1] + file[-16:]  # the real field cut away
    with pytest.raises(UnreadTransaction, match="no transaction file"):
        _named(cut, 0, len(cut))

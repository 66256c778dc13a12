"""Hostile input: references that try to escape the table root and the allowed bases, on write
and on read; hand-built session values; damaged bytes on read; gc next to symlinks. Every
refused input leaves the table as it was. The fuzzers are seeded (``derandomize``); a longer run
multiplies their example counts: ``BLOBHOUSE_FUZZ_SCALE=20``."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import lance
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from blobhouse import (
    Blob,
    BlobhouseError,
    BlobReadError,
    BlobSession,
    ColumnNameError,
    CorruptBlobError,
    ExternalBlobError,
    InvalidInputError,
    Kind,
    PreparedBlob,
    WrittenFile,
    blob_array,
    open_table,
    write_table,
)
from blobhouse.files.ranges import _balanced_groups, plan_reads, refs_from_arrow
from blobhouse.files.session import prepared_array, prepared_field
from blobhouse.io.objects import uri_to_path
from blobhouse.io.uris import normalize_uri
from blobhouse.placement import AllowedBases, MiB
from blobhouse.store.packs import store_base_id
from tests.helpers import aged, flip, flip_payload, stock_read, tree

SCALE = int(os.environ.get("BLOBHOUSE_FUZZ_SCALE", "1"))
SECRET = b"secret bytes outside every allowed base"
# logical blob values as users may type them: signed numbers, so negatives can be tried
LOGICAL_INPUT = pa.struct(
    [
        ("data", pa.large_binary()),
        ("uri", pa.utf8()),
        ("position", pa.int64()),
        ("size", pa.int64()),
        ("ref_id", pa.int64()),
    ]
)


def fuzz(examples: int) -> settings:
    return settings(
        max_examples=examples * SCALE,
        derandomize=True,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )


@dataclass
class World:
    """A table whose allowed base is ``media``, a secret outside it, and symlinks that point
    from inside the base to the secret."""

    root: Path
    media: Path
    secret: Path
    table: str

    def files(self) -> set[str]:
        return tree(self.table)


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> World:
    root = tmp_path_factory.mktemp("hostile")
    media, secret = root / "media", root / "secret"
    (media / "sub").mkdir(parents=True)
    secret.mkdir()
    (media / "ok.bin").write_bytes(bytes(range(100)))
    (media / "sub" / "ok2.bin").write_bytes(b"y" * 50)
    (media / "my clips").mkdir()
    (media / "my clips" / "50%2e take.bin").write_bytes(b"spaces and percent")
    (secret / "secret.bin").write_bytes(SECRET)
    (media / "link_out").symlink_to(secret, target_is_directory=True)
    (media / "link_file").symlink_to(secret / "secret.bin")
    table = str(root / "table")
    write_table(
        pa.table({"id": [0], "b": blob_array([b"first row" * 10_000])}),
        table,
        allowed_bases=[str(media)],
        dedup="global",
    )
    return World(root, media, secret, table)


def assert_unchanged(world: World, before: set[str], version: int) -> None:
    assert world.files() == before, "a refused write left files behind"
    assert open_table(world.table).version == version
    assert stock_read(world.table, "b")[0] == b"first row" * 10_000


def escapes(world: World) -> list[str]:
    """External URIs that try to leave the allowed base (each is a regression case)."""
    m, s = str(world.media), str(world.secret)
    return [
        f"{m}/../secret/secret.bin",
        f"{m}/sub/../../secret/secret.bin",
        f"file://{m}/%2e%2e/secret/secret.bin",
        f"file://{m}/%2E%2E/secret/secret.bin",
        f"file://{m}/..%2fsecret%2fsecret.bin",
        f"file://{m}/sub/%2e%2e%2f%2e%2e%2fsecret/secret.bin",
        f"file://{m}/link_out/secret.bin",
        f"{m}/link_file",
        f"file://evil.example{m}/ok.bin",
        f"file://localhost{s}/secret.bin",
        f"{s}/secret.bin",
        "/etc/passwd",
        "ok.bin",
        "http://127.0.0.1:9/ok.bin",
        "https://example.invalid/ok.bin",
        "ftp://example.invalid/ok.bin",
        "data:text/plain,secret",
        "javascript:alert(1)",
        "s3://user:password@bucket/ok.bin",
        "s3://bucket/../ok.bin",
        f"{m}/ok.bin\x00.txt",
        f"file://{m}/ok.bin%00",
        f"file://{m}/ok.bin?version=2",
        f"file://{m}/ok.bin#frag",
        f"{world.table}/data",
        f"{world.table}/_versions/1.manifest",
        "",
    ]


def test_escaping_external_uris_are_refused_on_write(world):
    before, version = world.files(), open_table(world.table).version
    for uri in escapes(world):
        rows = pa.table({"id": [1], "b": pa.array([{"uri": uri}], LOGICAL_INPUT)})
        with pytest.raises(InvalidInputError, match=r"'b', row 0"):
            write_table(rows, world.table, mode="append")
        assert_unchanged(world, before, version)


def test_paths_with_spaces_and_percent_signs_round_trip(world, tmp_path):
    """Found by the fuzzer: a name with a space failed to stat, and a literal ``%2e`` in a
    name would have been decoded to ``.`` by URI parsers. URIs are now percent-encoded."""
    target = world.media / "my clips" / "50%2e take.bin"
    uri = str(tmp_path / "t")
    table = write_table(
        pa.table({"b": blob_array([Blob(uri=str(target)), Blob(uri=target.as_uri())])}),
        uri,
        allowed_bases=[str(world.media)],
    )
    assert table.read_blobs("b", [0, 1]) == [target.read_bytes()] * 2
    assert stock_read(uri, "b") == [target.read_bytes()] * 2


def test_the_table_own_files_are_never_external_blobs(tmp_path):
    """A base may contain the table, but not the other way round, and nothing inside the table
    can be referenced as a user-owned external blob (gc and compaction own it)."""
    base = tmp_path / "all"
    base.mkdir()
    uri = str(base / "t")
    table = write_table(
        pa.table({"b": blob_array([b"x" * 100_000])}),
        uri,
        allowed_bases=[str(base)],
        dedup="content",
    )
    inside = table.blob_refs("b", [0])[0].as_py()["uri"]
    for target in (uri_to_path(inside), f"{uri}/data/../data/{Path(inside).parent.name}"):
        rows = pa.table({"b": blob_array([Blob(uri=target)])})
        with pytest.raises(ExternalBlobError, match="inside the table"):
            write_table(rows, uri, mode="append", dedup="content")
    with pytest.raises(InvalidInputError, match="lies inside the table"):
        write_table(
            rows,
            str(tmp_path / "u"),
            allowed_bases=[str(tmp_path / "u" / "media")],
            dedup="content",
        )
    assert open_table(uri).version == 1


def test_store_references_cannot_be_spelled_to_escape_the_store(world):
    before, version = world.files(), open_table(world.table).version
    data_file = next(Path(world.table, "data").glob("*.lance"))
    tricks = [
        f"{world.table}/_blobs/packs/../../data/{data_file.name}",
        f"{world.table}/_blobs/packs/%2e%2e/%2e%2e/data/{data_file.name}",
        f"{world.table}/_blobs/packs/sub/x.pack",
    ]
    for uri in tricks:
        rows = pa.table({"id": [1], "b": blob_array([Blob(uri=uri, position=0, size=1)])})
        with pytest.raises(InvalidInputError, match=r"'b', row 0"):
            write_table(rows, world.table, mode="append", dedup="global")
        assert_unchanged(world, before, version)


SEGMENTS = st.sampled_from(
    [
        "..",
        ".",
        "%2e%2e",
        "%2E.",
        ".%2e",
        "%2f",
        "%2F",
        "%5c",
        "\\",
        "",
        "sub",
        "ok.bin",
        "ok2.bin",
        "link_out",
        "link_file",
        "secret",
        "secret.bin",
        "%25",
        "%",
        "~",
        " ",
        "%00",
        "?",
        "#",
        ";",
        "@",
    ]
)
PREFIXES = st.sampled_from(["{m}/", "file://{m}/", "file://localhost{m}/", "FILE://{m}/", "{m}"])


@fuzz(400)
@given(prefix=PREFIXES, segments=st.lists(SEGMENTS, max_size=6))
@example(prefix="file://{m}/", segments=["%2e%2e", "secret", "secret.bin"])
@example(prefix="{m}/", segments=["link_out", "secret.bin"])
def test_fuzz_a_checked_uri_never_leads_outside_its_base(world, prefix, segments):
    """Whatever the spelling, a uri the check accepts is canonical and opens a file inside the
    base (what a reader opens is ``uri_to_path`` of it, with symlinks followed)."""
    uri = prefix.format(m=world.media) + "/".join(segments)
    bases = AllowedBases([str(world.media)], table_root=world.table)
    try:
        checked = bases.check(uri, column="b", row=0)
    except InvalidInputError:
        event("refused")
        return
    event("accepted")
    opened = os.path.realpath(uri_to_path(checked))
    assert opened.startswith(os.path.realpath(world.media) + os.sep), (uri, checked)
    assert normalize_uri(checked) == checked


def logical_rows():
    """Logical blob values, valid and not: bytes of three placements, external ranges in and
    past the object, hostile uris, negative and overflowing numbers."""
    numbers = st.sampled_from([None, 0, 1, 50, 99, 100, 101, -1, 2**31, 2**63 - 1])
    return st.one_of(
        st.none(),
        st.builds(
            lambda size, byte: {"data": bytes([byte]) * size},
            st.sampled_from([0, 1, 1000, 70_000]),
            st.integers(0, 3),
        ),
        st.builds(
            lambda uri, position, size, ref: {
                "uri": uri,
                "position": position,
                "size": size,
                "ref_id": ref,
            },
            st.sampled_from(["{m}/ok.bin", "{m}/sub/ok2.bin", "{m}/missing", "{m}/../secret"])
            | PREFIXES.flatmap(
                lambda p: st.lists(SEGMENTS, max_size=3).map(lambda s: p + "/".join(s))
            ),
            numbers,
            numbers,
            st.sampled_from([None, 0, 1, 7, -3]),
        ),
    )


def expected_bytes(row: dict | None, media: Path) -> bytes | None:
    if row is None:
        return None
    if "data" in row:
        return row["data"]
    path = os.path.realpath(uri_to_path(normalize_uri(row["uri"])))
    content = Path(path).read_bytes()
    if row["position"] is None:
        return content
    return content[row["position"] : row["position"] + row["size"]]


@fuzz(60)
@given(
    rows=st.lists(logical_rows(), min_size=1, max_size=6),
    dedup=st.sampled_from(["content", "global", "ref_id", "off"]),
)
def test_fuzz_writes_either_commit_exactly_or_refuse_cleanly(world, rows, dedup):
    """A write of arbitrary logical values either commits rows that read back exactly (through
    blobhouse and stock pylance) or raises an error naming the column and row, with the table
    unchanged."""
    values = []
    for row in rows:
        if row is not None and "uri" in row:
            row = {**row, "uri": row["uri"].format(m=world.media)}
        values.append(row)
    ids = list(range(1000, 1000 + len(values)))
    data = pa.table({"id": ids, "b": pa.array(values, LOGICAL_INPUT)})
    if open_table(world.table).properties.dedup != dedup:  # the mode is the table's
        open_table(world.table).set_properties(dedup=dedup)
    before, version = world.files(), open_table(world.table).version
    try:
        table = write_table(data, world.table, mode="append")
    except InvalidInputError as exc:
        assert "'b'" in str(exc) and "row" in str(exc), str(exc)
        assert_unchanged(world, before, version)
        event(f"refused: {type(exc).__name__}")
        return
    event("committed")
    expected = [expected_bytes(r, world.media) for r in values]
    assert SECRET not in [e for e in expected if e is not None]
    got = table.to_arrow(blobs="bytes").column("b").to_pylist()[-len(values) :]
    assert got == expected
    assert stock_read(world.table, "b")[-len(values) :] == expected
    table.delete("id >= 1000")


def hostile_writer(table_uri: str, value: PreparedBlob) -> int:
    """Commit one row holding ``value`` the way a writer that skips every check would: straight
    into a data file (no validation), added as a fragment. Returns the new version."""
    table = open_table(table_uri)
    session = BlobSession(table.data_file_path())
    schema = pa.schema([pa.field("id", pa.int64()), prepared_field("b")])
    batch = pa.record_batch([pa.array([99], pa.int64()), prepared_array([value])], schema=schema)
    writer = session.open_data_file(schema)
    writer.write_batch(batch)
    session.close_data_file(writer)
    written = WrittenFile(session.data_file_name, 1, writer.size_bytes, (), 0)
    return table.add_data_file(written).version


def hostile_values(world: World, base_id: int) -> list[PreparedBlob]:
    data_file = next(Path(world.table, "data").glob("*.lance"))
    return [
        PreparedBlob(Kind.EXTERNAL, size=10, uri=f"file://{world.secret}/secret.bin"),
        PreparedBlob(Kind.EXTERNAL, size=10, uri=f"file://{world.media}/link_out/secret.bin"),
        PreparedBlob(Kind.EXTERNAL, size=10, uri=f"file://{world.media}/%2e%2e/secret/secret.bin"),
        PreparedBlob(Kind.EXTERNAL, size=10, uri=f"file://{data_file}"),
        PreparedBlob(Kind.EXTERNAL, size=10, uri="../../secret/secret.bin", blob_id=base_id),
        PreparedBlob(Kind.EXTERNAL, size=10, uri="packs/../../secret.bin", blob_id=base_id),
        PreparedBlob(
            Kind.EXTERNAL, size=10, uri="%2e%2e/%2e%2e/secret/secret.bin", blob_id=base_id
        ),
        PreparedBlob(Kind.EXTERNAL, size=10, uri="relative/secret.bin"),
    ]


def test_references_written_by_a_careless_writer_are_refused_on_read(world, tmp_path):
    """Another writer (stock Lance, or a buggy one) may store any descriptor: reading the table
    through blobhouse refuses references outside its bases, whatever the blob mode."""
    uri = str(tmp_path / "t")
    write_table(
        pa.table({"id": [0], "b": blob_array([b"z" * 100_000])}),
        uri,
        allowed_bases=[str(world.media)],
        dedup="global",
    )
    base_id = store_base_id(lance.dataset(uri))
    for value in hostile_values(world, base_id):
        version = hostile_writer(uri, value)
        table = open_table(uri, version)
        for blobs in ("refs", "bytes"):
            with pytest.raises(BlobhouseError, match=r"'b', fragment \d+ row 0"):
                table.to_arrow(blobs=blobs)
        with pytest.raises(BlobhouseError, match=r"'b', fragment \d+ row 0"):
            table.read_blobs("b", [1])
        table.delete("id = 99")
        assert open_table(uri).read_blobs("b", [0]) == [b"z" * 100_000]


@fuzz(60)
@given(
    prefix=st.sampled_from(["file://{m}/", "{m}/", "", "file://{s}/"]),
    segments=st.lists(SEGMENTS, max_size=5),
    relative=st.booleans(),
)
def test_fuzz_reads_never_return_bytes_from_outside(
    world, tmp_path_factory, prefix, segments, relative
):
    """Whatever uri a careless writer stored, a blobhouse read returns bytes from inside the
    allowed base or the table's store, or raises a clear error; never the secret."""
    uri = str(tmp_path_factory.mktemp("careless") / "t")
    write_table(
        pa.table({"id": [0], "b": blob_array([b"z" * 100_000])}),
        uri,
        allowed_bases=[str(world.media)],
        dedup="global",
    )
    stored = prefix.format(m=world.media, s=world.secret) + "/".join(segments) or "x"
    base_id = store_base_id(lance.dataset(uri)) if relative else 0
    value = PreparedBlob(Kind.EXTERNAL, size=len(SECRET), uri=stored, blob_id=base_id)
    hostile_writer(uri, value)
    try:
        got = open_table(uri).read_blobs("b", [1])[0]
    except BlobhouseError as exc:
        assert "'b'" in str(exc), str(exc)
        event(f"refused: {type(exc).__name__}")
        return
    event("read bytes from inside")
    assert got != SECRET


def test_session_values_must_stay_in_their_namespace(world, tmp_path):
    table = open_table(world.table)
    session = BlobSession(table.data_file_path())
    column = session.open_writer("b")
    pack = column.new_packed()
    mine = pack.write_blob(b"0123456789")
    pack.finish()
    cases = {
        "not a sidecar of this session": PreparedBlob(Kind.PACKED, size=3, blob_id=5),
        "past the end": PreparedBlob(Kind.PACKED, size=11, blob_id=mine.blob_id),
        "covers its whole sidecar": PreparedBlob(Kind.DEDICATED, size=3, blob_id=mine.blob_id),
        "outside the table's allowed bases": PreparedBlob(
            Kind.EXTERNAL, size=5, uri=f"file://{world.secret}/secret.bin"
        ),
        "not normalized": PreparedBlob(
            Kind.EXTERNAL, size=5, uri=f"file://{world.media}/sub/../ok.bin"
        ),
    }
    for message, value in cases.items():
        data = pa.table({"id": [7], "b": prepared_array([value])})
        with pytest.raises(InvalidInputError, match=rf"'b', row 0: .*{message}"):
            session.write_data_file(data)
    for bad in (
        PreparedBlob(Kind.PACKED, size=-1, blob_id=1),
        PreparedBlob(Kind.PACKED, size=1, blob_id=2**32),
        PreparedBlob(Kind.MANAGED, size=1, blob_id=1),
        PreparedBlob(Kind.PACKED, size=2**63, position=2**63, blob_id=1),
        PreparedBlob(Kind.INLINE, size=4, data=b"abc"),
        PreparedBlob(Kind.EXTERNAL, size=1),
    ):
        with pytest.raises(InvalidInputError, match=r"'b', row 0: bad value"):
            session.open_writer("b").append(bad)
    with pytest.raises(InvalidInputError, match="out of range"):
        prepared_array([PreparedBlob(Kind.PACKED, size=-5, blob_id=1)])
    session.abort()


@pytest.mark.parametrize(
    "fields",
    [
        {"name": "../escape.lance"},
        {"name": "/etc/x.lance"},
        {"name": "x.lance", "sidecars": ("../../victim",)},
        {"name": "x.lance", "sidecars": ("x/../../../victim.blob",)},
        {"name": "x.lance", "packs": ("packs/../../data/victim.lance",)},
    ],
)
def test_written_file_names_cannot_lead_outside(fields):
    """A WrittenFile's names are committed and, on abort, deleted: they must be names blobhouse
    writes."""
    base = {"name": "x.lance", "num_rows": 1, "size_bytes": 1, "sidecars": (), "sidecar_bytes": 0}
    with pytest.raises(InvalidInputError, match="is not a name blobhouse writes"):
        WrittenFile(**{**base, **fields})


# --- damaged bytes on read ----------------------------------------------------------------


@pytest.mark.parametrize("dedup", ["content", "global"])
def test_reads_of_damaged_bytes_fail_naming_column_row_and_file(table_uri, dedup):
    payloads = [os.urandom(100_000), os.urandom(5_000_000), b"inline payload", os.urandom(70)]
    write_table(
        pa.table({"id": [0, 1, 2, 3], "b": blob_array(payloads)}),
        table_uri,
        dedup=dedup,
        placement={"b": {"dedicated_size_threshold": 1_000_000}},
    )
    table = open_table(table_uri)
    refs = table.blob_refs("b", [0, 1, 2, 3]).to_pylist()
    damaged = [0, 1, 2] if dedup == "content" else [0, 1]  # global stores small ones too
    for row in damaged:
        flip(refs[row]["uri"], refs[row]["position"] + refs[row]["size"] // 2)
    for row in damaged:
        where = rf"'b', fragment 0 row {row}: the bytes at {re.escape(refs[row]['uri'])}"
        with pytest.raises(CorruptBlobError, match=where):
            table.read_blobs("b", [row])
        with pytest.raises(CorruptBlobError, match="do not match the blake3"):
            table.take([row], blobs="bytes")
        with table.open_blob("b", row) as f, pytest.raises(CorruptBlobError, match=where):
            f.read()  # streaming the whole payload checks it at the end
        with table.open_blob("b", row) as f:
            f.seek(1)  # a ranged read cannot be checked: it returns what is stored
            assert f.read(4) == payloads[row][1:5]
    with pytest.raises(CorruptBlobError):
        table.to_arrow(blobs="bytes")
    assert table.read_blobs("b", [3]) == [payloads[3]]  # undamaged rows still read
    assert table.to_arrow(blobs="refs").num_rows == 4  # references never touch the bytes
    problems = {p["row"] for p in table.verify(deep=True)["problems"]}
    assert problems == set(damaged)


def test_damage_in_a_parallel_read_fails_naming_its_row(table_uri):
    # every other row of 24 payloads of 1 MB, rows 4 and 8 sharing one: separate ranges read
    # by several threads, each hashing what it read; the damaged row is named whichever
    # thread finds it
    payloads = [os.urandom(1_000_000) for _ in range(24)]
    payloads[8] = payloads[4]
    write_table(pa.table({"b": blob_array(payloads)}), table_uri)
    table = open_table(table_uri)
    rows = list(range(0, 24, 2))
    refs = table.blob_refs("b", range(24)).to_pylist()
    assert refs[8] == refs[4]
    assert (
        len(_balanced_groups(plan_reads(refs_from_arrow(table.blob_refs("b", rows))), 16, 4 * MiB))
        > 1
    )
    flip(refs[10]["uri"], refs[10]["position"] + 7)
    where = rf"'b', fragment 0 row 10: the bytes at {re.escape(refs[10]['uri'])}"
    with pytest.raises(CorruptBlobError, match=where):
        table.read_blobs("b", rows)
    with pytest.raises(CorruptBlobError, match=where):
        table.take(rows, blobs="bytes")
    rows.remove(10)
    assert table.read_blobs("b", rows) == [payloads[r] for r in rows]
    assert table.take(rows, blobs="bytes").column("b").to_pylist() == [payloads[r] for r in rows]
    flip(refs[4]["uri"], refs[4]["position"] + 7)  # the payload rows 4 and 8 share
    with pytest.raises(CorruptBlobError, match=r"'b', fragment 0 row [48]: the bytes"):
        table.read_blobs("b", [8, 4, 0])


def test_missing_and_truncated_objects_fail_naming_column_row_and_file(table_uri):
    payloads = [os.urandom(100_000), os.urandom(2_000_000), b"small"]
    write_table(
        pa.table({"b": blob_array(payloads)}),
        table_uri,
        placement={"b": {"dedicated_size_threshold": 1_000_000}},
        dedup="content",
    )
    table = open_table(table_uri)
    refs = table.blob_refs("b", [0, 1, 2]).to_pylist()
    os.truncate(uri_to_path(refs[1]["uri"]), 1000)
    short = rf"'b', fragment 0 row 1: short read from {re.escape(refs[1]['uri'])}"
    with pytest.raises(BlobReadError, match=short):
        table.read_blobs("b", [1])
    os.remove(uri_to_path(refs[0]["uri"]))
    missing = rf"'b', fragment 0 row 0: missing object {re.escape(refs[0]['uri'])}"
    with pytest.raises(BlobReadError, match=missing):
        table.read_blobs("b", [0])
    data_file = uri_to_path(refs[2]["uri"])
    os.remove(data_file)  # the manifest now points at a missing file
    with pytest.raises(OSError, match=os.path.basename(data_file)):
        open_table(table_uri).read_blobs("b", [2])
    (problem,) = open_table(table_uri).verify()["problems"]
    assert problem["uri"].endswith(os.path.basename(data_file))
    assert problem["reason"].startswith("missing data file")


def test_spark_reads_of_damaged_bytes_fail(spark, table_uri):
    write_table(pa.table({"b": blob_array([os.urandom(100_000)])}), table_uri)
    flip_payload(table_uri, "b", 0, offset=10)
    frame = spark.read.format("blobhouse").option("blobs", "bytes").load(table_uri)
    with pytest.raises(Exception, match="CorruptBlobError"):
        frame.collect()


# --- gc never leaves the table root --------------------------------------------------------


def test_gc_never_deletes_outside_the_table_root(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious.bin").write_bytes(b"keep me")
    media = tmp_path / "media"
    media.mkdir()
    (media / "clip.bin").write_bytes(b"user-owned clip")
    uri = str(tmp_path / "t")
    write_table(
        pa.table({"b": blob_array([Blob(uri=str(media / "clip.bin")), b"x" * 100_000])}),
        uri,
        allowed_bases=[str(media)],
    )
    link = Path(uri, "data", "link.lance")
    link.symlink_to(outside / "precious.bin")
    aged(tmp_path, hours=48, links=False)
    open_table(uri).gc(grace=timedelta(hours=1))
    assert (outside / "precious.bin").read_bytes() == b"keep me"  # the link went, not its target
    assert (media / "clip.bin").read_bytes() == b"user-owned clip"  # externals are never swept
    assert open_table(uri).read_blobs("b", [0, 1]) == [b"user-owned clip", b"x" * 100_000]

    moved = tmp_path / "moved-data"
    os.rename(Path(uri, "data"), moved)
    Path(uri, "data").symlink_to(moved, target_is_directory=True)
    (moved / "stray.bin").write_bytes(b"would be an orphan")
    aged(moved, hours=48, links=False)
    with pytest.raises(BlobhouseError, match="is a symlink; gc refuses"):
        open_table(uri).gc(grace=timedelta(hours=1))
    assert (moved / "stray.bin").exists()


# column names users and other tools type: Lance's separators and quotes, its row columns,
# blobhouse's working-column prefix, white space, control and non-ASCII characters
NAME_PARTS = st.sampled_from(
    ["", ".", "`", "_", "__bh_", "a", "Z9", " ", "\x00", "\t", "é", "图", "*"]
)
NAMES = st.one_of(
    st.lists(NAME_PARTS, max_size=4).map("".join),
    st.sampled_from(["_rowid", "_rowaddr", "_rowoffset", "_row_created_at_version", "img"]),
)


@fuzz(60)
@given(top=NAMES, child=NAMES, blob_in_struct=st.booleans())
@example(top="a.b", child="x", blob_in_struct=False)
@example(top="s", child="", blob_in_struct=True)
@example(top="img", child="x", blob_in_struct=False)  # the blob column's name, twice
def test_fuzz_column_names_either_read_back_everywhere_or_are_refused_cleanly(
    tmp_path_factory, top, child, blob_in_struct
):
    """Whatever the names, a write is refused with a ColumnNameError before anything is
    written, or every read (blobhouse's, stock pylance's) and verify work on what it wrote."""
    uri = str(tmp_path_factory.mktemp("names") / "t")
    payloads = [b"p" * 100, b"q" * 100]
    inner = pa.StructArray.from_arrays(
        [blob_array(payloads) if blob_in_struct else pa.array([1, 2])], [child]
    )
    data = pa.Table.from_arrays([blob_array(payloads), inner], ["img", top])
    try:
        table = write_table(data, uri)
    except ColumnNameError as refused:
        event(f"refused: {str(refused).split(': ', 2)[1][:60]}")
        assert not os.path.exists(uri)
        return
    event("written")
    blobs = table.blob_columns
    assert blobs == ["img", f"{top}.{child}"] if blob_in_struct else blobs == ["img"]
    for column in blobs:
        assert table.read_blobs(column, [0, 1]) == payloads
    assert table.to_arrow(blobs="bytes").num_rows == 2
    assert stock_read(uri, "img") == payloads
    assert lance.dataset(uri).to_table().num_rows == 2
    assert table.verify(deep=True)["problems"] == []


# a path component longer than a local file system takes (NAME_MAX: 255 bytes)
LONG = "a" * 256
LONG_UTF8 = "é" * 128  # 128 characters, 256 bytes


@pytest.mark.parametrize("where", ["leaf", "parent", "utf8"])
def test_a_table_path_with_a_too_long_component_is_refused_naming_it(tmp_path, where):
    name = {"leaf": LONG, "parent": f"{LONG}/t", "utf8": LONG_UTF8}[where]
    uri = str(tmp_path / name)
    for door in (
        lambda: write_table(pa.table({"img": blob_array([b"x"])}), uri),
        lambda: open_table(uri),
    ):
        with pytest.raises(InvalidInputError, match=r"is 256 bytes long; .* at most 255 bytes"):
            door()
    assert os.listdir(tmp_path) == []  # nothing written


def test_a_component_of_255_bytes_is_a_table_like_any(tmp_path):
    uri = str(tmp_path / ("b" * 255))
    table = write_table(pa.table({"img": blob_array([b"x" * 100_000, b"y"])}), uri)
    assert table.read_blobs("img", [0, 1]) == [b"x" * 100_000, b"y"]
    assert stock_read(uri, "img") == [b"x" * 100_000, b"y"]


def test_the_command_line_names_a_too_long_component(tmp_path, capsys):
    from blobhouse.cli import main

    assert main(["verify", str(tmp_path / LONG)]) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith("error: ") and "at most 255 bytes" in error and "\n" not in error


def test_an_external_uri_with_a_too_long_name_is_refused_naming_its_row(world):
    before, version = world.files(), open_table(world.table).version
    rows = pa.table({"id": [1, 2], "b": blob_array([b"ok", Blob(uri=f"{world.media}/{LONG}")])})
    with pytest.raises(ExternalBlobError, match=r"column 'b', row 1: external uri .*255 bytes"):
        write_table(rows, world.table, mode="append")
    assert_unchanged(world, before, version)


def test_a_managed_object_whose_owner_marker_cannot_be_named_is_refused(tmp_path):
    """Its own name fits (252 bytes), but not its owner marker's (``<name>.json``): refused
    when the row is read, before anything is written; referenced unmanaged, it is fine."""
    media = tmp_path / "media"
    media.mkdir()
    clip = media / ("c" * 252)
    clip.write_bytes(b"clip" * 1000)
    uri = str(tmp_path / "t")
    table = write_table(pa.table({"img": blob_array([b"x"])}), uri, allowed_bases=[str(media)])
    before = tree(uri)
    managed = pa.table({"img": blob_array([Blob(uri=str(clip), managed=True)])})
    with pytest.raises(ExternalBlobError, match=r"row 0: managed object .*257 bytes long.*250"):
        write_table(managed, uri, mode="append")
    assert open_table(uri).version == table.version and tree(uri) == before
    plain = pa.table({"img": blob_array([Blob(uri=str(clip))])})
    assert write_table(plain, uri, mode="append").read_blobs("img", [1]) == [b"clip" * 1000]


@pytest.mark.spark  # blobhouse.spark.ingest needs pyspark, though planning starts no Spark
def test_ingest_names_a_manifest_row_whose_path_is_too_long(tmp_path):
    from blobhouse.spark.ingest import plan_ingest

    manifest = tmp_path / "rows.jsonl"
    manifest.write_text('{"id": 1, "image": "' + LONG + '.jpg"}\n')
    with pytest.raises(InvalidInputError, match=r"row 1, column 'image': .*at most 255 bytes"):
        plan_ingest(str(manifest), str(tmp_path / "t"), ["image"])
    assert not (tmp_path / "t").exists()


def test_an_object_store_key_is_not_held_to_local_names(s3):
    """An S3 key may be 1,024 bytes: a table under a 300-byte segment is written and read."""
    uri = f"{s3.uri}/{'k' * 300}/t"
    table = write_table(
        pa.table({"img": blob_array([b"z" * 100_000])}), uri, storage_options=s3.options
    )
    assert table.read_blobs("img", [0]) == [b"z" * 100_000]

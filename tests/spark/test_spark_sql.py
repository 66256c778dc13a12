"""Spark SQL catalog tables: CREATE TABLE ... USING blobhouse, INSERT, SELECT with read_blob,
DESCRIBE, DROP TABLE, and the statements pyspark 4.3 cannot run (docs/spark-sql.md)."""

from __future__ import annotations

import os
import uuid

import lance
import pyarrow as pa
import pytest
from pyspark.sql.types import _parse_datatype_string

from blobhouse import open_table, write_table
from blobhouse.spark.catalog import parse_columns
from blobhouse.values import stored_blob_columns

pytestmark = pytest.mark.usefixtures("spark")
REF = "struct<uri:string,position:bigint,size:bigint,blake3:binary>"


@pytest.fixture
def table_name(spark):
    """Unique catalog table names for a test (the session catalog is shared), dropped after."""
    made: list[str] = []

    def name(base: str) -> str:
        made.append(f"{base}_{uuid.uuid4().hex[:8]}")
        return made[-1]

    yield name
    for name in made:
        spark.sql(f"DROP TABLE IF EXISTS {name}")


def rows(spark, query: str) -> list[tuple]:
    return [tuple(r) for r in spark.sql(query).collect()]


def describe(spark, table: str) -> dict[str, tuple[str, str | None]]:
    return {
        r.col_name: (r.data_type, r.comment) for r in spark.sql(f"DESCRIBE TABLE {table}").collect()
    }


def existing_table(uri: str, payloads: dict[int, bytes]) -> None:
    ids = pa.array(list(payloads), pa.int64())
    write_table(
        pa.table({"id": ids, "img": pa.array(list(payloads.values()))}),
        uri,
        blob_columns=["img"],
    )


def test_create_table_over_an_existing_table(spark, table_name, table_uri):
    payloads = {i: os.urandom(1000 + i) for i in range(20)}
    existing_table(table_uri, payloads)
    frames = table_name("frames")
    spark.sql(f"CREATE TABLE {frames} USING blobhouse OPTIONS (path '{table_uri}')")

    got = rows(
        spark,
        f"SELECT id, read_blob(img), blob_size(img) FROM {frames} WHERE id % 5 = 0 ORDER BY id",
    )
    assert got == [(i, payloads[i], len(payloads[i])) for i in range(0, 20, 5)]
    assert spark.sql(f"SELECT count(*) FROM {frames}").first()[0] == 20
    # DESCRIBE: blob columns as what the reader gives, references, with a comment saying so
    columns = describe(spark, frames)
    assert columns["id"] == ("bigint", None)
    assert columns["img"][0] == REF
    assert "read_blob(img)" in columns["img"][1]

    # the same table through LOCATION, and time travel through the statement's options
    write_table(
        pa.table({"id": pa.array([99], pa.int64()), "img": pa.array([b"new"])}),
        table_uri,
        mode="append",
    )
    located = table_name("located")
    spark.sql(f"CREATE TABLE {located} USING blobhouse LOCATION '{table_uri}'")
    assert spark.sql(f"SELECT count(*) FROM {located}").first()[0] == 21
    assert spark.sql(f"SELECT count(*) FROM {frames} WITH ('version' = '1')").first()[0] == 20
    # the DataFrame API reads catalog tables too
    assert spark.table(frames).where("id = 99").selectExpr("read_blob(img)").first()[0] == b"new"


def test_new_table_insert_and_insert_overwrite(spark, table_name, tmp_path):
    uri = str(tmp_path / "new")
    t = table_name("t")
    spark.sql(
        f"CREATE TABLE {t} USING blobhouse OPTIONS (path '{uri}', "
        "columns 'id BIGINT, img BINARY', blob_columns 'img', blobs 'bytes')"
    )
    # created by CREATE TABLE with its blob column: a SELECT before any INSERT finds no rows
    assert rows(spark, f"SELECT * FROM {t}") == []
    assert [".".join(p) for p in stored_blob_columns(lance.dataset(uri).schema)] == ["img"]
    assert describe(spark, t)["img"][0] == "binary"

    spark.sql(f"INSERT INTO {t} WITH ('path' = '{uri}') VALUES (1, X'0101'), (2, X'0202')")
    spark.sql(f"INSERT INTO {t} WITH ('path' = '{uri}') SELECT 3, unhex('0303')")
    assert rows(spark, f"SELECT id, img FROM {t} ORDER BY id") == [
        (1, b"\x01\x01"),
        (2, b"\x02\x02"),
        (3, b"\x03\x03"),
    ]
    spark.sql(f"INSERT OVERWRITE {t} WITH ('path' = '{uri}') VALUES (7, X'07')")
    assert rows(spark, f"SELECT * FROM {t}") == [(7, b"\x07")]
    assert lance.dataset(uri).count_rows() == 1

    # a second table over the same data reads the blobs lazily, as references
    refs = table_name("t_refs")
    spark.sql(f"CREATE TABLE {refs} USING blobhouse OPTIONS (path '{uri}')")
    assert rows(spark, f"SELECT id, read_blob(img) FROM {refs}") == [(7, b"\x07")]


def test_blob_columns_and_dedup_in_options_or_tblproperties(spark, table_name, tmp_path):
    payload = os.urandom(50_000)
    physical = {}
    for name, clause in [
        (
            "options",
            "OPTIONS (path '{uri}', columns '{cols}', blob_columns 'img', dedup 'content', "
            "blobs 'bytes')",
        ),
        (
            "properties",
            "OPTIONS (path '{uri}', columns '{cols}', blobs 'bytes') "
            "TBLPROPERTIES ('blob_columns' = 'img', 'dedup' = 'off')",
        ),
    ]:
        uri = str(tmp_path / name)
        t = table_name(name)
        spark.sql(
            f"CREATE TABLE {t} USING blobhouse "
            + clause.format(uri=uri, cols="id BIGINT, img BINARY")
        )
        # one task writes both rows (content dedup is per data file)
        spark.sql(
            f"INSERT INTO {t} WITH ('path' = '{uri}') SELECT /*+ COALESCE(1) */ * FROM VALUES "
            f"(1, X'{payload.hex()}'), (2, X'{payload.hex()}') AS v(id, img)"
        )
        assert [".".join(p) for p in stored_blob_columns(lance.dataset(uri).schema)] == ["img"]
        assert rows(spark, f"SELECT img FROM {t}") == [(payload,), (payload,)]
        physical[name] = open_table(uri).stats()["physical_bytes"]
    # the table's dedup applies to the INSERTs that name it
    assert physical == {"options": len(payload), "properties": 2 * len(payload)}


def test_drop_table_keeps_the_data(spark, table_name, table_uri):
    payloads = {1: b"one", 2: b"two"}
    existing_table(table_uri, payloads)
    t = table_name("t")
    spark.sql(f"CREATE TABLE {t} USING blobhouse OPTIONS (path '{table_uri}')")
    spark.sql(f"DROP TABLE {t}")
    assert t not in {r.tableName for r in spark.sql("SHOW TABLES").collect()}
    dataset = lance.dataset(table_uri)
    assert dataset.count_rows() == 2
    assert open_table(table_uri).to_arrow(blobs="bytes").column("img").to_pylist() == [
        b"one",
        b"two",
    ]
    spark.sql(f"CREATE TABLE {t} USING blobhouse OPTIONS (path '{table_uri}')")
    assert rows(spark, f"SELECT id, read_blob(img) FROM {t} ORDER BY id") == list(payloads.items())


def test_insert_names_its_table_and_never_writes_the_source(spark, table_name, tmp_path):
    uris = {name: str(tmp_path / name) for name in ("a", "b")}
    names = {name: table_name(name) for name in uris}
    for name, uri in uris.items():
        spark.sql(
            f"CREATE TABLE {names[name]} USING blobhouse OPTIONS (path '{uri}', "
            "columns 'id BIGINT, img BINARY', blob_columns 'img', blobs 'bytes')"
        )
    a, b = names["a"], names["b"]
    spark.sql(f"INSERT INTO {b} WITH ('path' = '{uris['b']}') VALUES (1, X'01')")

    # pyspark 4.3 gives the writer the source's columns here: without the path in the statement
    # the target is unknown, and the error says what to write instead
    with pytest.raises(Exception, match=r"INSERT INTO t WITH \('path' = '<uri>'\).*write_table"):
        spark.sql(f"INSERT INTO {a} SELECT * FROM {b}")
    with pytest.raises(Exception, match=r"WITH \('path'"):
        spark.sql(f"INSERT INTO {a} VALUES (2, X'02')")
    spark.sql(f"INSERT INTO {a} WITH ('path' = '{uris['a']}') SELECT * FROM {b}")
    assert rows(spark, f"SELECT * FROM {a}") == [(1, b"\x01")]
    assert rows(spark, f"SELECT * FROM {b}") == [(1, b"\x01")]
    assert lance.dataset(uris["b"]).version == 2  # created, one INSERT


def test_statements_pyspark_cannot_run_say_what_to_use(spark, table_name, table_uri, tmp_path):
    existing_table(table_uri, {1: b"x"})

    # a column list: Spark never shows the data source the OPTIONS
    declared = table_name("declared")
    spark.sql(
        f"CREATE TABLE {declared} (id BIGINT, img BINARY) USING blobhouse "
        f"OPTIONS (path '{table_uri}')"
    )
    with pytest.raises(Exception, match="without a column list"):
        spark.sql(f"SELECT * FROM {declared}").collect()

    # CREATE TABLE ... AS SELECT: the writer gets no path; Spark drops the new table again
    ctas = table_name("ctas")
    with pytest.raises(Exception, match="create the table, then INSERT"):
        spark.sql(
            f"CREATE TABLE {ctas} USING blobhouse OPTIONS (path '{tmp_path / 'ctas'}') "
            "AS SELECT 1L AS id"
        )
    assert ctas not in {r.tableName for r in spark.sql("SHOW TABLES").collect()}

    with pytest.raises(Exception, match=r"needs the table's location: OPTIONS \(path"):
        spark.sql(f"CREATE TABLE {table_name('nowhere')} USING blobhouse")
    with pytest.raises(Exception, match="declare its columns"):
        spark.sql(
            f"CREATE TABLE {table_name('missing')} USING blobhouse "
            f"OPTIONS (path '{tmp_path / 'missing'}')"
        )
    with pytest.raises(Exception, match="does not match the table"):
        spark.sql(
            f"CREATE TABLE {table_name('other')} USING blobhouse "
            f"OPTIONS (path '{table_uri}', columns 'id INT, img BINARY')"
        )

    # blob columns typed as references take no bytes; references written back are refused
    refs = table_name("refs")
    spark.sql(f"CREATE TABLE {refs} USING blobhouse OPTIONS (path '{table_uri}')")
    with pytest.raises(Exception, match=r"Cannot safely cast"):
        spark.sql(f"INSERT INTO {refs} WITH ('path' = '{table_uri}') VALUES (2, X'02')")
    with pytest.raises(Exception, match=r"hold blob references.*OPTIONS \(blobs 'bytes'\)"):
        spark.sql(f"INSERT INTO {refs} WITH ('path' = '{table_uri}') SELECT * FROM {refs}")
    with pytest.raises(Exception, match="reads blob columns as blobs='refs'"):
        spark.sql(f"SELECT * FROM {refs} WITH ('blobs' = 'bytes')").collect()
    with pytest.raises(Exception, match="TIME_TRAVEL"):
        spark.sql(f"SELECT * FROM {refs} VERSION AS OF 1").collect()
    with pytest.raises(Exception, match="does not support deletes"):
        spark.sql(f"DELETE FROM {refs} WHERE id = 1")
    spark.sql(f"ALTER TABLE {refs} ADD COLUMNS (z INT)")
    with pytest.raises(Exception, match=r"changed after CREATE TABLE \(ALTER TABLE\)"):
        spark.sql(f"SELECT * FROM {refs}").collect()
    assert lance.dataset(table_uri).count_rows() == 1


@pytest.mark.parametrize(
    "ddl",
    [
        "id BIGINT, img BINARY",
        "id bigint NOT NULL, img binary COMMENT 'it''s a frame', ts TIMESTAMP, d DATE",
        "a TINYINT, b SMALLINT, c INT, d LONG, e FLOAT, f DOUBLE, g BOOLEAN, h TIMESTAMP_NTZ",
        "a DECIMAL, b DECIMAL(20), c DEC(5, 2), `odd ``name``` STRING",
        "a ARRAY<STRING>, b MAP<STRING, ARRAY<BIGINT>>, c STRUCT<x: INT, y STRUCT<z BINARY>>",
    ],
)
def test_columns_option_parses_as_spark_does(spark, ddl):
    assert parse_columns(ddl) == _parse_datatype_string(ddl)


@pytest.mark.parametrize(
    ("ddl", "problem"),
    [
        ("", "declares no column"),
        ("id", "ends too early"),
        ("id BIGINT img BINARY", "expected ','"),
        ("name VARCHAR(10)", "declare the column STRING"),
        ("x INTERVAL", "not supported"),
        ("a INT, A INT", "declared twice"),
    ],
)
def test_columns_option_errors(ddl, problem):
    with pytest.raises(ValueError, match=problem):
        parse_columns(ddl)


def test_misspelled_table_options_are_refused(spark, table_name, table_uri):
    t = table_name("typo")
    with pytest.raises(Exception, match=r"'blob_column' \(did you mean 'blob_columns'\?\)"):
        spark.sql(
            f"CREATE TABLE {t} USING blobhouse OPTIONS (path '{table_uri}', "
            "columns 'id BIGINT, img BINARY', blob_column 'img')"
        )
    with pytest.raises(Exception, match=r"'dedupe' \(did you mean 'dedup'\?\)"):
        spark.sql(
            f"CREATE TABLE {t} USING blobhouse OPTIONS (path '{table_uri}', "
            "columns 'id BIGINT, img BINARY') TBLPROPERTIES ('dedupe' = 'off')"
        )
    assert not os.path.exists(os.path.join(table_uri, "_versions"))


@pytest.mark.parametrize("option", ["storage.aws_secret_access_key", "storage.ACCOUNT_KEY"])
def test_credentials_are_never_kept_in_the_catalog(spark, table_name, table_uri, option):
    """Spark keeps a catalog table's OPTIONS (SHOW CREATE TABLE prints them) and blobhouse the
    table's options in its columns' metadata: a key or a token there is refused, naming it,
    before anything is created; the error says where credentials go instead."""
    existing_table(table_uri, {1: b"x" * 100})
    leaky = table_name("leaky")
    for clause in (f"OPTIONS (path '{table_uri}', '{option}' 'hunter2')", "TBLPROPERTIES"):
        if clause == "TBLPROPERTIES":
            clause = f"OPTIONS (path '{table_uri}') TBLPROPERTIES ('{option}' = 'hunter2')"
        with pytest.raises(Exception, match=rf"(?i){option}.*kept in the Spark catalog"):
            spark.sql(f"CREATE TABLE {leaky} USING blobhouse {clause}")
        assert not spark.catalog.tableExists(leaky)
    frames = table_name("frames")  # what is not a credential is kept as before
    spark.sql(
        f"CREATE TABLE {frames} USING blobhouse "
        f"OPTIONS (path '{table_uri}', 'storage.aws_region' 'eu-west-1')"
    )
    assert rows(spark, f"SELECT count(*) FROM {frames}") == [(1,)]

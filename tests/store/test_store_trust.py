"""Nothing the store's index says returns bytes unchecked (issue 38): a damaged entry never
turns into a reference to another payload's bytes, and verify(deep=True) names it."""

from __future__ import annotations

import os
import re
import warnings

import lance
import pyarrow as pa
import pytest

from blobhouse import Blob, blob_array, open_table, write_table
from blobhouse.dedup import content_hash
from blobhouse.errors import CorruptBlobError, StoreIndexWarning
from blobhouse.io.objects import uri_to_path
from blobhouse.store.packs import index_uri
from tests.helpers import flip, stock_read

SIZE = 50_000


def _entries(uri: str) -> dict[bytes, dict]:
    return {r["blake3"]: r for r in lance.dataset(index_uri(uri)).to_table().to_pylist()}


def _set_entry(uri: str, digest: bytes, **values) -> None:
    """Damage one index entry the way a bit flip or a buggy tool would."""
    index = lance.dataset(index_uri(uri))
    index.update({k: repr(v) for k, v in values.items()}, where=f"blake3 = X'{digest.hex()}'")


def _table(tmp_path):
    """A global table holding payloads a and b of the same size, and a's index entry
    pointing at b's bytes (a flipped ``position``)."""
    a, b = os.urandom(SIZE), os.urandom(SIZE)
    uri = str(tmp_path / "t")
    write_table(pa.table({"id": [0, 1], "img": blob_array([a, b])}), uri)
    entries = _entries(uri)
    _set_entry(uri, content_hash(a), position=entries[content_hash(b)]["position"])
    return uri, a, b


def test_a_write_does_not_reference_a_damaged_index_entry(tmp_path):
    uri, a, _ = _table(tmp_path)
    with pytest.warns(StoreIndexWarning, match="differ from its entries"):
        table = write_table(pa.table({"id": [2], "img": blob_array([a])}), uri, mode="append")
    assert table.read_blobs("img", [2]) == [a]
    assert stock_read(uri, "img")[2] == a  # stock pylance too
    # the damaged entry is still named, and no row's bytes are wrong
    reasons = [p["reason"] for p in table.verify(deep=True)["problems"]]
    assert len(reasons) == 1 and reasons[0].startswith("store index entry"), reasons


def test_an_entry_of_the_wrong_size_is_not_referenced(tmp_path):
    a = os.urandom(SIZE)
    uri = str(tmp_path / "t")
    write_table(pa.table({"id": [0], "img": blob_array([a])}), uri)
    _set_entry(uri, content_hash(a), size=SIZE - 1)
    with pytest.warns(StoreIndexWarning):
        table = write_table(pa.table({"id": [1], "img": blob_array([a])}), uri, mode="append")
    assert table.read_blobs("img", [1]) == [a]


def test_a_row_is_checked_against_its_own_value_not_the_index(tmp_path):
    """A pack range rewritten with other bytes and the index entry of that range changed to
    match them: a check against the index would pass; the row records the hash of the value
    it was written with, so its checked read and verify fail."""
    a, b = os.urandom(SIZE), os.urandom(SIZE)
    uri = str(tmp_path / "t")
    table = write_table(pa.table({"id": [0], "img": blob_array([a])}), uri)
    ref = table.blob_refs("img", [0])[0].as_py()
    with open(uri_to_path(ref["uri"]), "r+b") as pack:
        pack.seek(ref["position"])
        pack.write(b)
    index = lance.dataset(index_uri(uri))
    index.update({"blake3": f"X'{content_hash(b).hex()}'"})
    table = open_table(uri)
    with pytest.raises(CorruptBlobError, match="img"):
        table.read_blobs("img", [0])
    problems = table.verify(deep=True)["problems"]
    assert any("content hash mismatch" in p["reason"] and p["row"] == 0 for p in problems)


@pytest.mark.parametrize("rewrite", ["compact", "update"])
def test_rows_a_rewrite_keeps_stay_checked_against_their_own_value(tmp_path, rewrite):
    """Compaction and updates keep store references as they are: the hash the rows recorded
    goes with them into the new data files."""
    a, b = os.urandom(SIZE), os.urandom(SIZE)
    uri = str(tmp_path / "t")
    for i in range(3):  # small fragments, for compaction to merge
        write_table(
            pa.table({"id": [i], "n": [i], "img": blob_array([a])}),
            uri,
            mode="create" if i == 0 else "append",
        )
    table = open_table(uri)
    if rewrite == "compact":
        assert table.compact()["fragments_removed"] == 3
    else:
        table.update({"n": "n + 1"})
    table = open_table(uri)
    ref = table.blob_refs("img", [0])[0].as_py()
    with open(uri_to_path(ref["uri"]), "r+b") as pack:
        pack.seek(ref["position"])
        pack.write(b)
    lance.dataset(index_uri(uri)).update({"blake3": f"X'{content_hash(b).hex()}'"})
    with pytest.raises(CorruptBlobError):
        open_table(uri).read_blobs("img", [0])


def test_verify_deep_names_a_damaged_index_entry_and_the_rows_referencing_it(tmp_path):
    uri, a, b = _table(tmp_path)
    table = open_table(uri)
    assert table.read_blobs("img", [0, 1]) == [a, b]  # the rows themselves are right
    report = table.verify(deep=True)
    entries = [p for p in report["problems"] if p["reason"].startswith("store index entry")]
    assert len(entries) == 1, report["problems"]
    (problem,) = entries
    assert content_hash(a).hex() in problem["reason"]
    assert content_hash(b).hex() in problem["reason"]  # what the bytes hash to
    assert problem["size"] == SIZE
    assert [r["row"] for r in problem["rows"]] == [1]  # the rows referencing those bytes
    assert not table.verify()["problems"]  # a shallow verify reads no bytes


def test_verify_deep_names_an_unreferenced_damaged_entry(tmp_path):
    uri, a, _ = _table(tmp_path)
    table = open_table(uri).delete("id = 1")
    entries = [
        p for p in table.verify(deep=True)["problems"] if p["reason"].startswith("store index")
    ]
    assert len(entries) == 1
    assert content_hash(a).hex() in entries[0]["reason"]


@pytest.mark.parametrize("path", ["bs.write_table", "df.write"])
def test_spark_writes_do_not_reference_a_damaged_index_entry(spark, tmp_path, path):
    import blobhouse.spark as bs

    uri, a, _ = _table(tmp_path)
    df = spark.createDataFrame([(2, a), (3, a)], "id long, img binary").repartition(2)
    if path == "bs.write_table":
        bs.write_table(df, uri, blob_columns=["img"], mode="append")
    else:
        df.write.format("blobhouse").option("blob_columns", "img").mode("append").save(uri)
    table = open_table(uri)
    ids = table.to_arrow(columns=["id"]).column("id").to_pylist()
    assert sorted(ids) == [0, 1, 2, 3]
    rows = [ids.index(2), ids.index(3)]
    assert table.read_blobs("img", rows) == [a, a]
    assert [stock_read(uri, "img")[r] for r in rows] == [a, a]


def _escaping(tmp_path, managed: bool):
    """A table referencing two objects under its allowed base; one is then replaced by a
    symlink that leads outside the base."""
    media, outside = tmp_path / "media", tmp_path / "outside"
    media.mkdir()
    outside.mkdir()
    (outside / "secret.bin").write_bytes(b"secret")
    for name in ("a.bin", "b.bin"):
        (media / name).write_bytes(os.urandom(1000))
    uri = str(tmp_path / "t")
    refs = [Blob(uri=str(media / n), managed=managed) for n in ("a.bin", "b.bin")]
    table = write_table(
        pa.table({"id": [0, 1], "clip": blob_array(refs)}),
        uri,
        allowed_bases=[str(media)],
        **({"managed_bases": [str(media)]} if managed else {}),
    )
    (media / "a.bin").unlink()
    (media / "a.bin").symlink_to(outside / "secret.bin")
    return table, media


@pytest.mark.parametrize("managed", [False, True])
def test_verify_and_gc_report_an_escaping_reference_and_go_on(tmp_path, managed):
    from datetime import timedelta

    table, media = _escaping(tmp_path, managed)
    uri = table.location.root
    with pytest.raises(Exception, match="outside"):
        open_table(uri).read_blobs("clip", [0])  # reads refuse it, as before
    report = open_table(uri).verify(deep=True)
    (problem,) = report["problems"]
    assert problem["row"] == 0 and problem["column"] == "clip"
    assert problem["reason"].startswith("unresolvable reference")
    assert report["hashed"] == 0 and report["references"] == 1  # the other row is checked
    table = open_table(uri).delete("id = 1")  # b.bin is no longer referenced
    for _ in range(3):  # enough runs to reclaim a managed object with no grace
        (unresolved,) = open_table(uri).gc(grace=timedelta(0))["unresolved_references"]
        assert unresolved.endswith("/media/a.bin")
    assert (media / "a.bin").is_symlink()  # what gc cannot judge is kept
    assert (media / "b.bin").exists()  # and nothing managed is reclaimed while it cannot judge


def test_verify_reports_an_object_it_cannot_read_and_goes_on(tmp_path):
    uri = str(tmp_path / "t")
    table = write_table(pa.table({"b": blob_array([os.urandom(3000), os.urandom(3000)])}), uri)
    (pack,) = {r.as_py()["uri"] for r in table.blob_refs("b", [0, 1])}
    path = uri_to_path(pack)
    os.remove(path)
    os.mkdir(path)  # there, but not readable as an object
    report = open_table(uri).verify(deep=True)
    missing = [p["row"] for p in report["problems"] if p["reason"] == "missing object"]
    assert sorted(missing) == [0, 1]
    entries = [p for p in report["problems"] if p["reason"].startswith("store index entry")]
    assert len(entries) == 2 and all("cannot be read" in p["reason"] for p in entries)


def _garble(paths) -> None:
    for path in paths:
        size = os.path.getsize(path)
        with open(path, "wb") as f:
            f.write(os.urandom(size))


@pytest.mark.parametrize("part", ["data", "_indices"])
def test_damaged_index_files_lower_dedup_and_are_reported(tmp_path, monkeypatch, part):
    """The index's own files damaged (its data file, or the scalar index on its hashes): a
    write stores the payload anew, verify names the damage, gc keeps every pack."""
    import glob
    from datetime import timedelta

    a = os.urandom(SIZE)
    uri = str(tmp_path / "t")
    monkeypatch.setattr("blobhouse.store.index_part._UNINDEXED_ROWS", 0)  # lookups from the start
    write_table(pa.table({"id": [0], "img": blob_array([a])}), uri)
    files = glob.glob(f"{index_uri(uri)}/{part}/**/*.lance", recursive=True)
    assert files
    _garble(files)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", StoreIndexWarning)
        table = write_table(pa.table({"id": [1], "img": blob_array([a])}), uri, mode="append")
    assert table.read_blobs("img", [0, 1]) == [a, a]
    assert stock_read(uri, "img") == [a, a]
    problems = open_table(uri).verify(deep=True)["problems"]
    if part == "data":  # a damaged scalar index is only slower: lookups scan the data
        (problem,) = problems
        assert problem["reason"].startswith("the store index")
        assert "cannot be read" in problem["reason"]
        report = open_table(uri).gc(grace=timedelta(0))
        assert report["store_index_unreadable"] and report["retired_packs"] == 0
    assert open_table(uri).read_blobs("img", [0, 1]) == [a, a]


def test_a_big_payload_is_checked_in_parts(tmp_path):
    """An entry of a payload bigger than the check's buffer (16 MiB) is hashed a part at a
    time: damage past the first part is found all the same."""
    big = os.urandom(20 << 20)
    uri = str(tmp_path / "t")
    table = write_table(pa.table({"id": [0], "img": blob_array([big])}), uri)
    ref = table.blob_refs("img", [0])[0].as_py()
    flip(ref["uri"], ref["position"] + (18 << 20))
    with pytest.warns(StoreIndexWarning):
        table = write_table(pa.table({"id": [1], "img": blob_array([big])}), uri, mode="append")
    assert table.read_blobs("img", [1]) == [big]


def _outside_entry(tmp_path, pack: str):
    """A global table holding payload a, whose index entry is rewritten to name ``pack``: a
    path that leaves the store, where a copy of a's pack stands (reading it would match)."""
    a = os.urandom(SIZE)
    uri = str(tmp_path / "t")
    write_table(pa.table({"id": [0], "img": blob_array([a])}), uri)
    real = _entries(uri)[content_hash(a)]["pack"]
    for outside in (tmp_path / "outside.pack", tmp_path / "t" / "outside.pack"):
        outside.write_bytes((tmp_path / "t" / "_blobs" / real).read_bytes())
    _set_entry(uri, content_hash(a), pack=pack)
    return uri, a


OUTSIDE = [
    "../../outside.pack",
    "packs/../../outside.pack",
    "%2e%2e/%2e%2e/outside.pack",
    "packs/%2e%2e%2f%2e%2e%2foutside.pack",
    "/etc/outside.pack",
    "s3://another-bucket/packs/x.pack",
    "packs/sub/../../../outside.pack",
]


@pytest.mark.parametrize("pack", OUTSIDE)
def test_an_entry_whose_pack_leaves_the_store_is_damaged(tmp_path, pack):
    """The write stores the payload anew in the store, with a warning naming the entry; it is
    never read there, never referenced; deep verify names it."""
    uri, a = _outside_entry(tmp_path, pack)
    with pytest.warns(StoreIndexWarning, match=r"outside the store.*" + re.escape(repr(pack))):
        table = write_table(pa.table({"id": [1], "img": blob_array([a])}), uri, mode="append")
    assert table.read_blobs("img", [0, 1]) == [a, a]
    assert stock_read(uri, "img") == [a, a]
    packs = {e["pack"] for e in lance.dataset(index_uri(uri)).to_table().to_pylist()}
    assert pack in packs and any(p.startswith("packs/") and ".." not in p for p in packs)
    refs = table.blob_refs("img", [1]).field("uri").to_pylist()
    assert refs[0].startswith(f"file://{uri}/_blobs/packs/") and "%2e" not in refs[0].lower()
    again = write_table(pa.table({"id": [2], "img": blob_array([a])}), uri, mode="append")
    assert again.read_blobs("img", [2]) == [a]  # later writes of the payload go through too
    reasons = [p["reason"] for p in again.verify(deep=True)["problems"]]
    assert len(reasons) == 1 and "leaves the store" in reasons[0], reasons
    assert content_hash(a).hex() in reasons[0]


def test_spark_writes_do_not_follow_an_entry_out_of_the_store(spark, tmp_path):
    import blobhouse.spark as bs

    uri, a = _outside_entry(tmp_path, "../../outside.pack")
    df = spark.createDataFrame([(1, a), (2, a)], "id long, img binary").repartition(2)
    bs.write_table(df, uri, blob_columns=["img"], mode="append", dedup="global")
    df.write.format("blobhouse").option("blob_columns", "img").mode("append").save(uri)
    table = open_table(uri)
    assert table.read_blobs("img", list(range(5))) == [a] * 5
    uris = table.blob_refs("img", list(range(5))).field("uri").to_pylist()
    assert all(u.startswith(f"file://{uri}/_blobs/packs/") for u in uris), uris

"""Tables on Azure Blob Storage (``az://``), on Azurite, Microsoft's emulator, on 127.0.0.1:
blobhouse's own objects go through obstore (the object_store crate Lance uses), with the same
storage options as Lance."""

from __future__ import annotations

import os
import threading

import lance
import pyarrow as pa
import pytest

from blobhouse import blob_array, open_table, write_table
from blobhouse.errors import UnknownOptionError
from blobhouse.io.objects import object_store, put_new

KIB = 1024


def rows(ids: list[int], payloads: list[bytes]) -> pa.Table:
    return pa.table({"id": pa.array(ids, pa.int64()), "img": blob_array(payloads)})


def test_objects_on_azure(azure):
    store = object_store(azure.uri, azure.options)
    one, two = f"{azure.uri}/x/one", f"{azure.uri}/x/two"
    store.put(one, b"12345")
    assert store.size(one) == 5 and store.size(two) is None
    with pytest.raises(FileExistsError, match="already exists"):  # a conditional PUT lost
        existing = store.create(one)
        existing.write(b"other")
        existing.close()
    new = store.create(two)
    new.write(b"ab")
    new.write(b"c")
    new.close()
    assert sorted((o.name, o.size) for o in store.list(f"{azure.uri}/x")) == [
        ("one", 5),
        ("two", 3),
    ]
    source = store.open(one)
    # ranged reads; past the end they give what there is, as a file does
    assert (source.read(1, 3), source.read(3, 10), source.read(9, 3)) == (b"234", b"45", b"")
    source.close()
    store.delete(one)
    store.delete(one)  # deleting what is gone is no error
    assert store.size(one) is None and store.list(f"{azure.uri}/nothing") == []
    with pytest.raises(FileNotFoundError, match="x/one"):
        store.open(one).read(0, 1)


def test_of_racing_creators_exactly_one_wins_on_azure(azure):
    store = object_store(azure.uri, azure.options)
    uri = f"{azure.uri}/claim"
    won: list[bool] = []
    threads = [
        threading.Thread(target=lambda n=n: won.append(put_new(store, uri, b"%d" % n)))
        for n in range(8)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(won) == [False] * 7 + [True]


@pytest.mark.parametrize("dedup", ["global", "content", "off"])
def test_every_dedup_mode_on_azure_and_stock_lance_reads_it(azure, dedup):
    uri = f"{azure.uri}/t"
    shared, big = os.urandom(300 * KIB), os.urandom(2 * 1024 * KIB)
    data = rows([1, 2, 3, 4], [shared, shared, b"small", big])
    write_table(data, uri, dedup=dedup, storage_options=azure.options)
    table = write_table(data, uri, mode="append", storage_options=azure.options)
    assert table.read_blobs("img", [0, 1, 2, 3, 5]) == [shared, shared, b"small", big, shared]
    stored = table.stats()["physical_bytes"]
    unique = len(shared) + len(b"small") + len(big)
    expected = {
        "global": unique,  # once in the table
        "content": 2 * unique,  # once per write
        "off": 2 * (unique + len(shared)),  # once per row
    }[dedup]
    assert stored == expected
    dataset = lance.dataset(uri, storage_options=azure.options)
    pairs = dataset.read_blobs("img", indices=list(range(8)), preserve_order=True)
    assert [payload for _, payload in pairs] == [shared, shared, b"small", big] * 2
    assert open_table(uri, storage_options=azure.options).verify(deep=True)["problems"] == []


def test_changes_and_maintenance_on_azure(azure):
    uri = f"{azure.uri}/t"
    clip = os.urandom(200 * KIB)
    write_table(rows([1, 2, 3], [clip] * 3), uri, storage_options=azure.options)
    table = open_table(uri, storage_options=azure.options)
    table.update(
        {"img": lambda batch: [b"new-%d" % i for i in batch["id"].to_pylist()]}, where="id = 1"
    )
    source = rows([3, 4], [b"three", clip])
    table.merge_insert("id").when_matched_update_all().when_not_matched_insert_all().execute(source)
    table.add_columns({"double": "id * 2"})
    table.backfill_blob_column("thumb", lambda batch: [b"t%d" % i for i in batch["id"].to_pylist()])
    table.delete("id = 2")
    table.maintenance.compact()
    report = table.gc(retain_versions=1)
    assert report["removed_files"] > 0
    table = open_table(uri, storage_options=azure.options)
    got = {r["id"]: (r["img"], r["thumb"]) for r in table.to_arrow(blobs="bytes").to_pylist()}
    assert got == {1: (b"new-1", b"t1"), 3: (b"three", b"t3"), 4: (clip, b"t4")}
    assert table.stats()["columns"]["img"]["physical_bytes"] == len(clip) + len(b"new-1three")
    assert table.verify(deep=True)["problems"] == []


def test_a_misspelled_azure_option_is_refused(azure):
    options = {**azure.options, "acount_key": azure.options["account_key"]}
    with pytest.raises(UnknownOptionError, match="did you mean 'account_key'"):
        write_table(rows([1], [b"x"]), f"{azure.uri}/t", storage_options=options)


def test_spark_writes_reads_and_maintains_a_table_on_azure(spark, azure):
    import blobhouse.spark as bs
    from blobhouse.spark.datasource import storage_prefixed

    uri = f"{azure.uri}/clips"
    storage = storage_prefixed(azure.options)
    chunks = [b"chunk-%d" % (i % 3) * 50_000 for i in range(24)]
    df = spark.createDataFrame(list(enumerate(chunks)), "id long, chunk binary").repartition(3)
    df.write.format("blobhouse").mode("append").option("blob_columns", "chunk").options(
        **storage
    ).save(uri)
    table = open_table(uri, storage_options=azure.options)
    # round-robin partitions: every chunk reached every task, and was stored once
    assert table.stats()["physical_bytes"] == sum(len(c) for c in set(chunks))
    back = spark.read.format("blobhouse").options(**storage).load(uri).where("id < 4")
    got = bs.materialize(back, ["chunk"], storage_options=azure.options).collect()
    assert {r.id: r.chunk for r in got} == {i: chunks[i] for i in range(4)}
    assert bs.verify(spark, uri, deep=True, storage_options=azure.options)["problems"] == []


def test_an_http_azure_endpoint_turns_on_allow_http_as_on_s3(azure):
    from blobhouse.io.objects import checked_options

    options = {k: v for k, v in azure.options.items() if k != "allow_http"}
    assert checked_options(options)["allow_http"] == "true"
    table = write_table(rows([1], [b"x" * 5000]), f"{azure.uri}/t", storage_options=options)
    assert table.read_blobs("img", [0]) == [b"x" * 5000]


@pytest.mark.parametrize("server", ["LocalAzureServer", "LocalS3Server"])
def test_an_emulator_ends_with_the_process_that_started_it(server):
    """A test run killed (SIGKILL: no cleanup runs) left Azurite and moto running; the kernel now
    ends them with the process that started them."""
    import signal
    import subprocess
    import sys
    import time

    script = (
        f"import sys, time\nfrom blobhouse.testing import {server}\n"
        f"server = {server}().__enter__()\n"
        "print(server._process.pid, flush=True)\ntime.sleep(600)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    child = int(parent.stdout.readline())
    os.kill(child, 0)  # running
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{child}/stat") as stat:
                if stat.read().rsplit(")", 1)[1].split()[0] == "Z":  # ended, not reaped yet
                    return
        except FileNotFoundError:
            return
        time.sleep(0.1)
    os.kill(child, signal.SIGKILL)
    raise AssertionError(f"{server}'s process {child} outlived the process that started it")


def test_an_azure_store_with_no_account_is_refused_naming_it(azure, monkeypatch, capsys):
    """Without an account Lance raised a raw ValueError, the loader obstore's own error."""
    from blobhouse.cli import main
    from blobhouse.errors import InvalidInputError
    from blobhouse.loader import BatchLoader

    uri = f"{azure.uri}/t"
    write_table(rows([1], [b"x" * 5000]), uri, storage_options=azure.options)
    for name in list(os.environ):
        if name.startswith("AZURE_"):
            monkeypatch.delenv(name)
    refused = rf"cannot reach {azure.uri}/.*Account must be specified.*storage options"
    with pytest.raises(InvalidInputError, match=refused):
        write_table(rows([2], [b"y"]), f"{azure.uri}/other")
    with pytest.raises(InvalidInputError, match=refused):
        open_table(uri)
    with pytest.raises(InvalidInputError, match=refused):
        next(iter(BatchLoader(uri, ["img"], batch_size=1)))
    assert main(["stats", uri]) == 2
    err = capsys.readouterr().err
    assert "Account must be specified" in err and "Traceback" not in err


def test_a_wrong_azure_key_fails_a_read_naming_the_object_once(azure):
    from blobhouse import BlobRef, read_ranges
    from blobhouse.errors import BlobReadError

    table = write_table(
        rows([1], [b"q" * 100_000]), f"{azure.uri}/t", storage_options=azure.options
    )
    ref = BlobRef(**table.blob_refs("img", [0])[0].as_py())
    wrong = {**azure.options, "account_key": "A" * 86 + "=="}
    with pytest.raises(BlobReadError) as refused:
        read_ranges([ref], storage_options=wrong)
    assert str(refused.value).count(ref.uri) == 1, refused.value
    assert "privileges" in str(refused.value) or "authoriz" in str(refused.value).lower()

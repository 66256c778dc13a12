"""Opening or creating a table at the wrong place or version: each case its own error type and
message, and nothing written."""

from __future__ import annotations

import os
from datetime import timedelta

import lance
import pyarrow as pa
import pytest

import blobhouse.spark as bs
from blobhouse import (
    InvalidInputError,
    NotATableError,
    PathIsFileError,
    PathNotFoundError,
    TableNotFoundError,
    VersionNotFoundError,
    VersionRemovedError,
    open_table,
    write_table,
)
from tests.helpers import tree

ROWS = pa.table({"id": [1, 2]})


def test_each_wrong_path_has_its_own_error(tmp_path):
    (tmp_path / "a-file").write_text("hello")
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "todo.txt").write_text("x")
    (tmp_path / "empty").mkdir()
    cases = {
        "missing": (PathNotFoundError, "no such file or folder"),
        "a-file": (PathIsFileError, "it is a file"),
        "a-file/t": (PathIsFileError, "a folder above it, is a file"),
        "notes": (NotATableError, "folder of todo.txt"),
        "empty": (NotATableError, "an empty folder"),
    }
    for name, (kind, message) in cases.items():
        with pytest.raises(kind, match=message) as raised:
            open_table(str(tmp_path / name))
        assert isinstance(raised.value, TableNotFoundError)  # what callers caught before
        assert type(raised.value) is kind


def test_a_version_that_never_existed_and_one_cleanup_removed(table_uri):
    for _ in range(4):
        write_table(ROWS, table_uri, mode="append")
    lance.dataset(table_uri).cleanup_old_versions(older_than=timedelta(0), retain_versions=2)
    with pytest.raises(VersionRemovedError, match="oldest retained version is 3"):
        open_table(table_uri, 1)
    with pytest.raises(VersionNotFoundError, match=r"never existed .*latest is 4") as raised:
        open_table(table_uri, 9)
    assert type(raised.value) is VersionNotFoundError
    assert open_table(table_uri, 3).version == 3


def test_writing_at_a_file_or_below_one_is_refused(tmp_path):
    (tmp_path / "a-file").write_text("hello")
    for name in ("a-file", "a-file/t"):
        with pytest.raises(PathIsFileError, match="cannot create a table"):
            write_table(ROWS, str(tmp_path / name))
    assert (tmp_path / "a-file").read_text() == "hello"


def test_a_new_table_is_not_mixed_into_a_folder_of_other_files(tmp_path):
    folder = tmp_path / "photos"
    folder.mkdir()
    (folder / "cat.jpg").write_bytes(b"jpeg")
    with pytest.raises(InvalidInputError, match=r"folder of other files .*allow_nonempty_folder"):
        write_table(ROWS, str(folder))
    assert sorted(os.listdir(folder)) == ["cat.jpg"]
    table = write_table(ROWS, str(folder), allow_nonempty_folder=True)
    assert table.count_rows() == 2
    write_table(ROWS, str(folder), mode="append")  # a table now: appends need no flag


@pytest.mark.parametrize(
    "users",
    [
        ["data/cat.jpg"],  # a project folder with its own data/
        ["data/2024/notes.txt", "data/2024/run.lance"],
        ["data/readme.md", "data/part-0.lance"],  # a Lance-looking file does not make it a table's
        ["data/photo.lance"],  # named like Lance's, but not what a failed create stages
        ["data/clip/frame.blob"],
        ["tree/oak.png"],
    ],
)
def test_a_new_table_is_not_mixed_into_a_users_data_folder(tmp_path, users):
    """Only the leftovers of a failed create may be in a new table's folder: a folder named
    ``data/`` (or ``tree/``) holding a user's files is not one, and gc would sweep them."""
    folder = tmp_path / "project"
    for name in users:
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(name.encode())
    with pytest.raises(InvalidInputError, match=f"folder of other files .*{users[0]}"):
        write_table(ROWS, str(folder))
    assert tree(str(folder)) == set(users)
    assert all((folder / name).read_bytes() == name.encode() for name in users)


def test_a_symlink_in_a_new_tables_folder_is_named_once(tmp_path):
    folder = tmp_path / "project"
    folder.mkdir()
    (tmp_path / "elsewhere.txt").write_text("x")
    (folder / "link").symlink_to(tmp_path / "elsewhere.txt")
    with pytest.raises(InvalidInputError, match=r"folder of other files \(link\)"):
        write_table(ROWS, str(folder))


def test_a_symlinked_folder_inside_data_is_another_file(tmp_path):
    """A symlinked directory in ``data/``: a new table is not made beside it, and gc, on a
    table made there anyway, lists it as foreign and leaves it and what it leads to alone."""
    folder, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    (folder / "data").mkdir(parents=True)
    elsewhere.mkdir()
    (elsewhere / "precious.bin").write_bytes(b"x")
    (folder / "data" / "shots").symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(InvalidInputError, match=r"folder of other files \(data/shots\)"):
        write_table(ROWS, str(folder))
    table = write_table(ROWS, str(folder), allow_nonempty_folder=True)
    report = table.gc(grace=timedelta(0))
    assert report["foreign_files"] == [str(folder / "data" / "shots")]
    assert (folder / "data" / "shots").is_symlink()
    assert (elsewhere / "precious.bin").read_bytes() == b"x"


def test_spark_refuses_a_folder_of_other_files_unless_asked(spark, tmp_path):
    bs.register(spark)
    folder = tmp_path / "photos"
    folder.mkdir()
    (folder / "cat.jpg").write_bytes(b"jpeg")
    df = spark.createDataFrame([(1,)], "id long")
    with pytest.raises(InvalidInputError, match="folder of other files"):
        bs.write_table(df, str(folder))
    assert sorted(os.listdir(folder)) == ["cat.jpg"]
    bs.write_table(df, str(folder), options={"allow_nonempty_folder": "true"})
    assert open_table(str(folder)).count_rows() == 1


def test_a_table_opens_at_a_path_object(tmp_path):
    """``open_table`` and ``write_table`` take a ``pathlib.Path`` as well as a string."""
    write_table(pa.table({"id": [1, 2]}), tmp_path / "t")
    table = open_table(tmp_path / "t")
    assert table.count_rows() == 2
    table.delete("id = 1")
    assert open_table(tmp_path / "t").count_rows() == 1

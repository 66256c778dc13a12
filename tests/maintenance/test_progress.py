"""Progress: every long step reports one event type with the rows and bytes behind its units
and their rate; callbacks of the earlier ``(step, done, total)`` form are still called so."""

from __future__ import annotations

from datetime import timedelta

import pyarrow as pa
import pytest

from blobhouse import blob_array, open_table, write_table
from blobhouse.lerobot import export_lerobot, ingest_lerobot
from blobhouse.lerobot.sample import write_sample_dataset
from blobhouse.progress import ProgressEvent, progress_to


def test_callbacks_of_either_form_and_a_clear_error_for_anything_else(capsys):
    events: list[ProgressEvent] = []
    report = progress_to(events.append)
    report("verify", 0, 2)
    report("verify", 2, 2, rows=7, bytes=3_000)
    assert [(e.step, e.done, e.total, e.rows, e.bytes) for e in events] == [
        ("verify", 0, 2, None, None),
        ("verify", 2, 2, 7, 3_000),
    ]
    assert events[1].seconds >= events[0].seconds == 0 and events[1].finished
    told: list[tuple] = []

    def earlier(step, done, total):
        told.append((step, done, total))

    for callback in (earlier, lambda *args: told.append(args)):
        progress_to(callback)("gc", 1, 3, rows=5, bytes=9)
    progress_to(print)("mark", 2, 4, bytes=1)
    assert told == [("gc", 1, 3), ("gc", 1, 3)] and capsys.readouterr().out == "mark 2 4\n"
    assert progress_to(report) is report and progress_to(None) is None
    with pytest.raises(TypeError, match="progress must be a callable"):
        progress_to("bars")


def test_a_step_reported_again_from_zero_starts_its_clock_anew():
    events: list[ProgressEvent] = []
    report = progress_to(events.append)
    report("sweep", 0, 1)
    report("sweep", 1, 1, bytes=10)
    report("sweep", 0, 1)  # a retry of the step
    assert events[-1].seconds == 0 and events[-1].bytes_per_second is None


def _table(tmp_path, appends: int = 3):
    uri = str(tmp_path / "t")
    for n in range(appends):
        ids = list(range(n * 4, n * 4 + 4))
        payloads = blob_array([bytes([i]) * 100_000 for i in ids])
        write_table(pa.table({"id": ids, "img": payloads}), uri, mode="append" if n else "create")
    return open_table(uri)


def test_verify_compact_and_gc_report_bytes_and_rows(tmp_path):
    table = _table(tmp_path)
    events: list[ProgressEvent] = []
    table.delete("id < 2")
    done = table.compact(progress=events.append)
    compacted = [e for e in events if e.step == "compact"]
    assert compacted[0].rows == 0 and compacted[-1].finished
    assert (compacted[-1].rows, compacted[-1].bytes) == (done["rows"], done["bytes_before"])
    events.clear()
    table = open_table(table.uri)
    table.verify(progress=events.append)
    verified = [e for e in events if e.step == "verify"]
    assert verified[-1].finished and verified[0].bytes == 0
    fragments = table.dataset.get_fragments()
    latest = sum(f.file_size_bytes for frag in fragments for f in frag.metadata.files)
    assert verified[-1].bytes >= latest > 0  # every retained version's data files, once
    events.clear()
    deep = table.verify(deep=True, progress=events.append)
    hashed = [e for e in events if e.step == "verify"][-1]
    # deep: the payloads read to be hashed too (each stored range once)
    payloads = sum(len(v) for v in table.to_arrow(blobs="bytes")["img"].to_pylist())
    assert deep["hashed"] > 0 and hashed.bytes >= verified[-1].bytes + payloads
    events.clear()
    gone = table.gc(older_than=timedelta(0), grace=timedelta(0), progress=events.append)
    marked = [e for e in events if e.step == "mark"]
    assert marked[-1].finished and marked[-1].bytes >= latest
    swept = _last_of_each([e for e in events if e.step in ("sweep", "reap packs")])
    assert all(e.finished for e in swept) and "reap packs" in {e.step for e in swept}
    assert sum(e.bytes for e in swept) == gone["removed_by_sweep"]["bytes"] > 0
    # Lance's cleanup is one call: told as it starts and as it ends, with what it removed
    cleaned = [e for e in events if e.step == "clean versions"]
    assert [(e.done, e.bytes) for e in cleaned] == [
        (0, 0),
        (len(gone["removed_versions"]), gone["removed_by_lance_cleanup"]["bytes"]),
    ]
    assert cleaned[0].total == len(gone["removed_versions"]) > 0 and cleaned[-1].finished


def test_the_earlier_callback_form_hears_every_step_as_before(tmp_path):
    table = _table(tmp_path, appends=2)
    told: list[tuple[str, int, int]] = []
    table.verify(progress=lambda step, done, total: told.append((step, done, total)))
    assert told[0] == ("verify", 0, 2) and told[-1] == ("verify", 2, 2)


def test_lerobot_import_and_export_report_bytes_and_frames(tmp_path):
    source = write_sample_dataset(str(tmp_path / "robot"), episodes=2, frames=6, size=(16, 16))
    events: list[ProgressEvent] = []
    done = ingest_lerobot(source, str(tmp_path / "t"), progress=events.append)
    videos = [e for e in events if e.step == "video files"]
    frames = [e for e in events if e.step == "frames"]
    assert videos[-1].finished and videos[-1].bytes == done.video_bytes > 0
    assert frames[-1].finished and frames[-1].rows == done.frames == 12
    events.clear()
    export_lerobot(done.table, tmp_path / "out", progress=events.append)
    written = [e for e in events if e.step == "frames"]
    assert written[-1].rows == 12
    exported = [e for e in events if e.step.startswith("video files of")]
    on_disk = sum(p.stat().st_size for p in (tmp_path / "out" / "videos").rglob("*.mp4"))
    assert exported and sum(e.bytes for e in _last_of_each(exported)) == on_disk


def _last_of_each(events: list[ProgressEvent]) -> list[ProgressEvent]:
    return list({e.step: e for e in events}.values())

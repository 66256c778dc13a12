"""The main job and the CLI, end to end on small data (on the shared local Spark session): help
text, one-line errors, reports and progress."""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import lance
import pyarrow as pa
import pytest

from blobhouse import blob_array, open_table, write_table
from blobhouse.cli import build_parser, main
from blobhouse.cli.console import ProgressBars, print_report
from blobhouse.cli.demo import BLOB_COLUMNS, FPS, EpisodeData, ReadBack, read_back, run_demo
from blobhouse.files.ranges import REF_TYPE
from blobhouse.progress import ProgressEvent
from tests.helpers import stock_read

pytestmark = pytest.mark.usefixtures("spark")


def test_demo_writes_queries_verifies_and_reports(tmp_path, capsys):
    out = str(tmp_path / "episodes")
    assert main(["demo", "--rows", "75", "--out", out, "--json", "--master", "local[2]"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["rows"] == 75
    assert report["mismatches"] == 0
    assert report["verified_blobs"] == 225
    data = EpisodeData(75)
    chunks = [len(data.chunk(i)) for i in range(3)]
    video = report["columns"]["video"]
    assert video["physical_bytes"] == sum(chunks)
    assert video["logical_bytes"] == FPS * chunks[0] + FPS * chunks[1] + 15 * chunks[2]
    assert report["sql_first_frames"] == [{"episode": 0, "frames": 3, "video_bytes": sum(chunks)}]
    rows = open_table(out).to_arrow(columns=["row"]).column("row").to_pylist()
    assert stock_read(out, "video") == [data.payload("video", r) for r in rows]


def test_demo_steps_report_rows_and_bytes_and_its_read_back_finds_damage(spark, tmp_path):
    out = str(tmp_path / "episodes")
    events: list[ProgressEvent] = []
    report = run_demo(
        out, 75, master="local[2]", progress=lambda _: None, task_progress=events.append
    )
    last = {e.step: e for e in events}
    assert (last["write"].rows, last["write"].bytes) == (75, report["logical_bytes"])
    assert last["read"].rows == 75 and last["read"].bytes == report["read_bytes"]
    # each stored range read once by each task that reads rows sharing it
    assert report["physical_bytes"] <= report["read_bytes"] < 2 * report["physical_bytes"]
    data = EpisodeData(75)
    assert read_back(spark, out, EpisodeData(75, seed=1))["mismatches"] == 225  # other bytes
    packs = sorted(Path(out).rglob("*.pack"), key=lambda p: p.stat().st_size)
    damaged = packs[-1]  # video chunks: a byte changed in the middle of the largest pack
    with open(damaged, "r+b") as file:
        file.seek(damaged.stat().st_size // 2)
        byte = file.read(1)
        file.seek(-1, 1)
        file.write(bytes([byte[0] ^ 0xFF]))
    checked = read_back(spark, out, data)
    assert checked["checked"] == 225 and 1 <= checked["mismatches"] < 225


def test_the_read_back_finds_a_range_holding_another_rows_payload(tmp_path):
    """A row whose reference points at another row's bytes is a mismatch, whether the range
    is read in the same batch or was read (and hashed) by an earlier one; a recorded blake3
    that differs from the bytes is one too."""
    data = EpisodeData(60)
    out = str(tmp_path / "episodes")
    write_table(pa.Table.from_batches(data.batches_for(range(2))), out, blob_columns=BLOB_COLUMNS)
    table = open_table(out)
    rows = table.to_arrow(columns=["row"]).column("row").to_pylist()
    refs = {c: table.blob_refs(c, list(range(60))).to_pylist() for c in BLOB_COLUMNS}

    def batch(positions: list[int], thumbnails: list[int]) -> pa.RecordBatch:
        columns = {"row": pa.array([rows[p] for p in positions], pa.int64())}
        for column in BLOB_COLUMNS:
            chosen = thumbnails if column == "thumbnail" else positions
            columns[column] = pa.array([refs[column][p] for p in chosen], REF_TYPE)
        return pa.record_batch(columns)

    def mismatches(*batches: pa.RecordBatch) -> list[int]:
        return [b.column("mismatches")[0].as_py() for b in ReadBack(data)(iter(batches))]

    right = list(range(30))
    assert mismatches(batch(right, right), batch(right, right)) == [0, 0]
    swapped = [1, 0, *range(2, 30)]  # rows 0 and 1 each reference the other's thumbnail
    assert mismatches(batch(right, swapped)) == [2]  # the ranges read in this batch
    assert mismatches(batch(right, right), batch(right, swapped)) == [0, 2]  # read before
    forged = dict(refs["thumbnail"][5], blake3=bytes(32))  # bytes right, recorded hash not
    refs["thumbnail"][5] = forged
    assert mismatches(batch(right, right)) == [1]


def test_demo_never_deletes_what_is_at_out(tmp_path, capsys):
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "notes.txt").write_text("keep me")
    assert main(["demo", "--rows", "30", "--out", str(folder), "--master", "local[2]"]) == 2
    assert "holds other files (notes.txt)" in capsys.readouterr().err
    assert (folder / "notes.txt").read_text() == "keep me" and len(list(folder.iterdir())) == 1
    a_file = tmp_path / "file"
    a_file.write_bytes(b"x")
    for out in (a_file, a_file / "below"):
        assert main(["demo", "--rows", "30", "--out", str(out), "--master", "local[2]"]) == 2
        assert "is a file" in capsys.readouterr().err and a_file.read_bytes() == b"x"
    other = str(tmp_path / "someone-elses")
    write_table(pa.table({"id": [1], "img": blob_array([b"mine"])}), other)
    assert main(["demo", "--rows", "30", "--out", other, "--master", "local[2]"]) == 2
    assert "not the demo's" in capsys.readouterr().err
    assert open_table(other).version == 1 and open_table(other).read_blobs("img", [0]) == [b"mine"]


def test_stats_command(tmp_path, capsys):
    out = str(tmp_path / "episodes")
    main(["demo", "--rows", "30", "--out", out, "--master", "local[2]"])
    capsys.readouterr()
    assert main(["stats", out]) == 0
    text = capsys.readouterr().out
    assert "30 (0 deleted)" in text and "video" in text
    assert main(["stats", out, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["rows"] == 30


def test_missing_table_is_a_clear_error(tmp_path, capsys):
    assert main(["stats", str(tmp_path / "nope")]) == 2
    assert "no table at" in capsys.readouterr().err


@pytest.mark.object_store  # the demo starts a local S3 server of its own
def test_demo_on_a_local_s3_server(capsys):
    args = ["demo", "--rows", "40", "--local-s3", "--json", "--master", "local[2]"]
    assert main(args) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["table"] == "s3://blobhouse-demo/episodes"
    assert (report["rows"], report["verified_blobs"], report["mismatches"]) == (40, 120, 0)
    assert report["columns"]["video"]["physical_bytes"] == sum(
        len(EpisodeData(40).chunk(i)) for i in range(2)
    )


def test_missing_table_is_one_line_and_debug_adds_the_traceback(tmp_path, capsys):
    missing = str(tmp_path / "nope")
    for argv in (["stats", missing], ["verify", missing, "--json"], ["gc", missing]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: no table at") and err.count("\n") == 1, err
    for argv in (["--debug", "stats", missing], ["stats", missing, "--debug"]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert "Traceback" in err and err.rstrip().splitlines()[-1].startswith("error: no table")


def test_an_error_about_a_long_path_is_printed_whole(tmp_path, capsys):
    """blobhouse's own messages are printed whole, however long the path they name (they were
    cut at 500 characters, and the cut took the end of the message: what to do)."""
    deep = tmp_path.joinpath(*["d" * 120] * 5)
    deep.mkdir(parents=True)
    write_table(pa.table({"video": blob_array([b"x" * 100])}), str(deep / "t"))
    damaged = {"blobhouse:dedup": "bogus", "blobhouse:ref-id-field": "x9"}
    lance.dataset(str(deep / "t")).update_field_metadata({"video": damaged})
    assert main(["properties", str(deep / "t"), "--set", "dedup.video=content"]) == 2
    err = capsys.readouterr().err
    assert len(err) > 700 and err.count("\n") == 1, err
    assert not err.rstrip().endswith("...") and str(deep / "t") in err, err


def test_unexpected_errors_are_one_line_too(tmp_path, capsys, monkeypatch):
    import blobhouse.table

    def broken(*args, **kwargs):
        raise RuntimeError("disk on fire\nsecond line")

    monkeypatch.setattr(blobhouse.table, "open_table", broken)
    assert main(["stats", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert err == "error: RuntimeError: disk on fire (--debug prints the traceback)\n"


def subparsers(parser):
    import argparse

    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices
    return {}


def test_the_top_level_help_is_prose(capsys):
    """Its description once held a line of Python an edit left there."""
    with pytest.raises(SystemExit):
        main(["--help"])
    shown = capsys.readouterr().out
    assert "import" not in shown and "--json" in shown and "--debug" in shown


HEAVY = ("lance", "pyarrow", "pyspark", "pandas", "numpy", "obstore")


@pytest.mark.parametrize(
    "argv",
    [["--help"], ["gc", "--help"], ["stats"], ["statz", "t"], ["gc", "t", "--grace-hours", "x"]],
)
def test_help_and_argument_errors_answer_without_loading_lance_or_spark(argv):
    """Loading Lance and pyarrow takes most of a second: help and a misspelled command or
    option answer without them."""
    probe = (
        "import sys\n"
        "from blobhouse.cli import main\n"
        "try:\n"
        f"    main({argv!r})\n"
        "except SystemExit:\n"
        "    pass\n"
        f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True
    )
    assert run.stdout.strip().splitlines()[-1] == "[]", run.stdout + run.stderr


def test_every_option_and_argument_has_help_and_help_is_plain_text(capsys):
    parser = build_parser()
    commands = subparsers(parser)
    assert set(commands) == {
        "demo",
        "ingest",
        "ingest-lerobot",
        "export-lerobot",
        "stats",
        "verify",
        "gc",
        "compact",
        "relocate",
        "properties",
    }
    for name, command in [("blobhouse", parser), *commands.items()]:
        for action in command._actions:
            if action.dest == "command":
                continue
            assert action.help and action.help.strip(), (name, action.dest)
    for argv in (["--help"], *[[name, "--help"] for name in commands]):
        with pytest.raises(SystemExit) as done:
            main(argv)
        assert done.value.code == 0
        text = capsys.readouterr().out
        assert "``" not in text and ":func:" not in text and text.strip(), argv


def test_every_command_prints_json_and_takes_debug():
    for name, command in subparsers(build_parser()).items():
        options = {o for action in command._actions for o in action.option_strings}
        assert {"--json", "--debug", "--storage-option"} <= options, name


def test_misspelled_options_and_commands_get_a_suggestion(capsys):
    for argv, hint in [
        (["ingest", "m.jsonl", "t", "--blob-columns", "x", "--dedupe", "off"], "--dedup?"),
        (["stats", "t", "--jsn"], "--json?"),
        (["ingst"], "ingest?"),
    ]:
        with pytest.raises(SystemExit) as done:
            main(argv)
        assert done.value.code == 2
        assert f"did you mean {hint}" in capsys.readouterr().err


def test_a_bad_command_line_is_one_line_and_no_option_is_taken_by_prefix(table_uri, capsys):
    write_table(pa.table({"id": [1]}), table_uri)
    for argv, message in [
        (
            ["gc", table_uri, "--retain-version", "2"],  # not run as --retain-versions
            "error: blobhouse gc: unknown option --retain-version (did you mean "
            "--retain-versions?)",
        ),
        (["gc", table_uri, "--grace", "1"], "unknown option --grace (did you mean --grace-hours?)"),
        (
            ["compact", table_uri, "--repack-threshold", "0.5"],  # an option that was replaced
            "unknown option --repack-threshold (replaced by --max-unused)",
        ),
        (["stats"], "the following arguments are required: table"),
        (["gc", table_uri, "--retain-versions", "x"], "versions from 1 to 2**63 - 1, got 'x'"),
        (["stats", table_uri, "extra"], "unexpected argument extra"),
    ]:
        with pytest.raises(SystemExit) as done:
            main(argv)
        assert done.value.code == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1 and "usage:" not in err, err
    assert open_table(table_uri).version == 1  # nothing ran


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["gc", "--grace-hours", "nan"],
            "--grace-hours: must be a number of hours from 0 to 876,000",
        ),
        (
            ["gc", "--grace-hours", "inf"],
            "--grace-hours: must be a number of hours from 0 to 876,000",
        ),
        (
            ["gc", "--grace-hours", "1e300"],
            "--grace-hours: must be a number of hours from 0 to 876,000, ",
        ),
        (["gc", "--grace-hours", "1e300"], "got '1e300' (too long)"),
        (["gc", "--grace-hours", "-5"], "876,000, got '-5'"),
        (["gc", "--older-than-hours", "nan"], "--older-than-hours: must be a number of hours"),
        (["gc", "--retain-versions", "0"], "--retain-versions: must be a whole number of versions"),
        (["compact", "--target-rows", "0"], "--target-rows: must be a whole number of rows from 1"),
        (["compact", "--target-mb", "0"], "--target-mb: must be at least 0.000001 (a byte)"),
        (["compact", "--target-mb", "1e-9"], "--target-mb: must be at least 0.000001 (a byte)"),
        (["compact", "--target-mb", "nan"], "--target-mb: must be at least 0.000001 (a byte)"),
        (["compact", "--max-unused", "nan"], "--max-unused: must be a number in [0, 1]"),
        (["compact", "--max-unused", "2"], "must be a number in [0, 1], got '2'"),
        (["compact", "--deleted-fraction", "0"], "must be a number in (0, 1], got '0'"),
    ],
)
def test_a_bad_number_is_refused_naming_its_option(table_uri, capsys, argv, message):
    """Found trying the CLI: nan, inf and huge hours raised ValueError or OverflowError (exit
    1), a nan threshold ran, and -5 hours was named by its Python parameter."""
    write_table(pa.table({"id": [1]}), table_uri)
    with pytest.raises(SystemExit) as done:
        main([*argv[:1], table_uri, *argv[1:]])
    assert done.value.code == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err
    assert open_table(table_uri).version == 1  # nothing ran


# from the first line of blobhouse's own code on (Python's start, ~30 ms, is the interpreter's)
@pytest.mark.parametrize("delay", [0.1, 0.3, 0.8])
def test_ctrl_c_while_starting_exits_130_without_a_traceback(table_uri, delay):
    import signal

    write_table(pa.table({"id": [1]}), table_uri)
    child = subprocess.Popen(
        [sys.executable, "-m", "blobhouse.cli", "gc", table_uri, "--dry-run"],
        stderr=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    time.sleep(delay)
    child.send_signal(signal.SIGINT)
    _, err = child.communicate(timeout=60)
    # finished before the signal, or as Python exited (which restores the default handler),
    # or before blobhouse's first line ran (on a loaded machine Python may still be compiling
    # blobhouse/cli.py at 0.1 s: the traceback is runpy's, no frame of ours in it)
    # or, loaded more, while Python still imported `site` ("Fatal Python error:
    # init_import_site", exit 1): the interpreter's start, not a line of ours
    interpreter_start = "Fatal Python error: init_import_site" in err
    if child.returncode in (0, -signal.SIGINT) or interpreter_start:
        assert "Traceback" not in err or not re.search(r'File "[^"]*/blobhouse/', err), err
        return
    assert child.returncode == 130, err
    # by 0.8 s gc may have begun marking: its progress lines come first, the interruption last
    lines = err.splitlines()
    assert "Traceback" not in err and lines[-1].startswith("interrupted"), err
    assert all(line.startswith(("mark: ", "interrupted")) for line in lines), err


# a Ctrl-C while Python defines the module's classes, after its imports (a timed signal hit
# it once): signalled here at the last moment before main() runs, as the console script
# (``blobhouse``) and as ``python -m blobhouse.cli``
_SIGINT_BEFORE_MAIN = {
    "console_script": "sys.argv = ['blobhouse', 'stats']\nimport blobhouse.cli\n"
    "os.kill(os.getpid(), signal.SIGINT)\nsignal.pause()",
    # what ``python -m`` does: sys.argv[0] is "-m" while the package loads
    "module": "sys.argv = ['-m', 'stats']\n"
    "sys.setprofile(lambda frame, event, _: event == 'call' and frame.f_code.co_name == 'main' "
    "and frame.f_globals['__name__'] == 'blobhouse.cli' and os.kill(os.getpid(), signal.SIGINT))\n"
    "runpy._run_module_as_main('blobhouse.cli')",
}


@pytest.mark.parametrize("start", sorted(_SIGINT_BEFORE_MAIN))
def test_ctrl_c_after_the_cli_module_loaded_but_before_main_is_one_line(start):
    code = "import os, runpy, signal, sys\n" + _SIGINT_BEFORE_MAIN[start]
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 130, done.stderr
    assert done.stderr == "interrupted while starting; nothing was changed\n"


# a Ctrl-C once the command printed its report: as Python shuts down, and as it finalizes
# (it puts back the default handler before it tears its modules down: the process once died
# by the signal, exit -2)
_AFTER_THE_REPORT = {
    "shutdown": "code = main()\nos.kill(os.getpid(), signal.SIGINT)\ntime.sleep(1)\n"
    "sys.exit(code)\n",
    "finalization": "class AtTeardown:\n"
    "    def __del__(self):\n"
    "        os.kill(os.getpid(), signal.SIGINT)\n"
    "kept = AtTeardown()  # collected as __main__ goes, after the handlers are reset\n"
    "sys.exit(main())\n",
}


@pytest.mark.parametrize("when", sorted(_AFTER_THE_REPORT))
def test_ctrl_c_after_the_command_ended_keeps_its_exit_code(table_uri, when):
    write_table(pa.table({"id": [1]}), table_uri)
    code = (
        "import os, signal, sys, time\n"
        f"sys.argv = ['blobhouse', 'stats', {table_uri!r}]\n"
        "from blobhouse.cli import main\n" + _AFTER_THE_REPORT[when]
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "rows" in done.stdout and "Traceback" not in done.stderr


def test_ctrl_c_held_down_during_a_command_is_one_line_saying_what_is_true(table_uri):
    """A held key repeats: the second Ctrl-C once came while the first was answered, and the
    command ended saying it was interrupted while starting."""
    write_table(pa.table({"id": [1]}), table_uri)
    code = (
        "import os, signal, sys, threading, time\n"
        f"sys.argv = ['blobhouse', 'stats', {table_uri!r}]\n"
        "import blobhouse.cli as cli\n"
        "def held():\n"
        "    for _ in range(300):\n"
        "        os.kill(os.getpid(), signal.SIGINT)\n"
        "        time.sleep(0.001)\n"
        "stats = cli.COMMANDS['stats']\n"
        "def command(args, run):\n"
        "    run.status('reading the statistics ...')\n"
        "    threading.Thread(target=held).start()\n"
        "    time.sleep(5)  # the command at work\n"
        "    return stats(args, run)\n"
        "cli.COMMANDS['stats'] = command\n"
        "cli.run._stop_spark = lambda: time.sleep(0.2)  # as long as Spark takes to stop\n"
        "sys.exit(cli.main())\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 130, done.stderr
    lines = done.stderr.splitlines()
    assert lines[-1] == "interrupted: reading the statistics; nothing was changed", done.stderr
    assert "Traceback" not in done.stderr and "starting" not in done.stderr


def test_an_unreachable_spark_master_is_one_line_at_once(tmp_path, capsys):
    import socket

    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    started = time.monotonic()
    master = f"spark://127.0.0.1:{port}"
    out = str(tmp_path / "episodes")
    assert main(["demo", "--rows", "30", "--out", out, "--master", master]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: cannot reach the Spark master {master}") and err.count("\n") == 1
    assert time.monotonic() - started < 10


def test_missing_pyspark_names_the_extra(tmp_path):
    code = (
        "import sys; sys.modules['pyspark'] = None; from blobhouse.cli import main; "
        "sys.exit(main(sys.argv[1:]))"
    )
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            code,
            "ingest",
            "m.jsonl",
            str(tmp_path / "t"),
            "--blob-columns",
            "f",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert done.stderr == 'error: blobhouse ingest needs Spark: pip install "blobhouse[spark]"\n'


def test_reports_print_fields_the_library_adds(tmp_path, capsys, monkeypatch):
    from blobhouse.table import Table

    uri = str(tmp_path / "t")
    write_table(pa.table({"id": [1, 2], "img": blob_array([b"x" * 10, b"x" * 10])}), uri)
    stats = Table.stats

    def more(self):
        report = stats(self)
        report["bytes_only_in_old_versions"] = 1_234_567
        report["columns"]["img"]["held_by_deleted_rows_bytes"] = 0
        return report

    monkeypatch.setattr(Table, "stats", more)
    assert main(["stats", uri]) == 0
    out = capsys.readouterr().out
    assert "orphans        0 files" in out  # the summary lines keep their shape
    assert "bytes only in old versions  1.2 MB" in out
    assert "held by deleted rows bytes" in out and "img" in out
    assert main(["stats", uri, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["bytes_only_in_old_versions"] == 1_234_567


def test_print_report_renders_records_and_long_lists():
    report = {
        "removed_versions": list(range(1, 41, 2)),
        "kept_versions": [*range(1, 502), 700, 702],
        "problems": [
            {"version": 3, "column": "img", "rows": [1, 2], "reason": "missing object"},
            {"version": 4, "column": "img", "rows": [5], "reason": "missing object", "new": 1},
        ],
        "nested": {"a": {"x": 1}, "b": {"x": 2, "y": 3}},
        "empty": [],
    }
    out = io.StringIO()
    print_report(report, file=out)
    text = out.getvalue()
    assert "removed versions  1, 3, 5, 7, 9, 11, 13, 15, ... (12 more)" in text
    assert "kept versions     1-501, 700, 702" in text  # runs, not 503 numbers
    assert "empty             none" in text
    lines = text.splitlines()
    assert all(line == line.rstrip() for line in lines)  # logs get no trailing blanks
    header = next(line for line in lines if line.startswith("version"))
    assert header.split() == ["version", "column", "rows", "reason", "new"]
    assert any(line.split()[:3] == ["4", "img", "5"] for line in lines)
    assert any(line.split() == ["b", "2", "3"] for line in lines)


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_bars_on_a_terminal_and_short_lines_elsewhere():
    screen = Terminal()
    with ProgressBars(screen) as bars:
        for done in range(4):
            bars(
                ProgressEvent(
                    "verify", done, 3, rows=done * 100, bytes=done * 2_000_000, seconds=done
                )
            )
        bars.message("a line above the bars")
    drawn = screen.getvalue()
    assert "verify" in drawn and "3/3" in drawn and "a line above the bars" in drawn
    assert "300 rows" in drawn and "6.0 MB" in drawn and "2.0 MB/s" in drawn
    log = io.StringIO()
    with ProgressBars(log) as bars:
        for done in range(4):
            bars(ProgressEvent("mark", done, 3))
        bars(ProgressEvent("sweep", 0, 2, rows=0, bytes=0))
        bars(ProgressEvent("sweep", 2, 2, rows=2, bytes=3_000_000, seconds=1.5))
        bars.message("note")
    assert log.getvalue() == (
        "mark: 0/3\nmark: 3/3\nsweep: 0/2, 0 rows, 0.0 MB\n"
        "sweep: 2/2, 2 rows, 3.0 MB, 2.0 MB/s\nnote\n"
    )

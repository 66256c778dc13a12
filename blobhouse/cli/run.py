"""One run of a ``blobhouse`` command: Spark started and stopped around it, a failure as one
line, Ctrl-C (the process's handler, :class:`CtrlC`), and Python's and Spark's logging."""

from __future__ import annotations

import argparse
import atexit
import contextlib
import logging
import os
import re
import signal
import socket
import sys
import tempfile
import threading
import time
import traceback
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from blobhouse.cli.console import ProgressBars
from blobhouse.cli.starting import STARTING_AS_COMMAND, interrupted_while_starting
from blobhouse.commit.interrupts import HeldInterrupts, when_interrupted
from blobhouse.errors import BlobhouseError, InvalidInputError, MissingExtraError
from blobhouse.progress import ProgressEvent

INTERRUPTED = 130  # the exit code of a command stopped by Ctrl-C


class _CtrlC:
    """SIGINT in the ``blobhouse`` process. The first Ctrl-C raises ``KeyboardInterrupt`` (after
    Spark's own handler, once Spark put one in front: it cancels the jobs); while the command
    says what is true, more are absorbed (a held key repeats, and a second exception would cut
    that line), and one :data:`FORCE_AFTER` seconds later ends the process at once; once the
    command has its exit code, Ctrl-C ends the process with that code."""

    FORCE_AFTER = 2.0

    def __init__(self) -> None:
        self.first: float | None = None  # when the first Ctrl-C came
        self.code: int | None = None  # the command's exit code, once it has one
        self.spark: Callable | None = None  # Spark's handler, which it installs as it starts
        self.run: Run | None = None  # the command's run, once it began

    def __call__(self, signum: int, frame: object) -> None:
        if self.code is not None:
            os._exit(self.code)
        if self.first is None:
            self.first = time.monotonic()
            if self.spark is not None:  # cancels Spark's jobs, raises KeyboardInterrupt
                with contextlib.suppress(Exception):  # (Spark stopped already, say)
                    self.spark(signum, frame)
            raise KeyboardInterrupt
        if time.monotonic() - self.first >= self.FORCE_AFTER:
            os.write(2, b"interrupted again: stopped at once\n")
            os._exit(INTERRUPTED)

    def install(self) -> None:
        """Put this handler in front, after Spark's if Spark put its own there since."""
        if threading.current_thread() is not threading.main_thread():
            return  # (a status from another thread) Python handles signals in the main one
        current = signal.getsignal(signal.SIGINT)
        if current is self or isinstance(getattr(current, "__self__", None), HeldInterrupts):
            return  # (a commit holds Ctrl-C until its records are written: it puts ours back)
        if callable(current) and current not in (
            signal.default_int_handler,
            interrupted_while_starting,
        ):
            self.spark = current
        signal.signal(signal.SIGINT, self)

    def absorb(self) -> None:
        """A Ctrl-C is being answered (it may have come through Spark's handler): the next
        ones are absorbed."""
        self.install()
        if self.first is None:
            self.first = time.monotonic()

    def settle(self, code: int) -> None:
        """The command ended with ``code``: a Ctrl-C from now on ends the process with it,
        and one while Python finalizes (which puts back the default handler: the process
        would die of the signal) is ignored."""
        sys.stdout.flush()
        sys.stderr.flush()
        self.code = code
        self.install()
        atexit.register(signal.signal, signal.SIGINT, signal.SIG_IGN)


CTRL_C = _CtrlC()


@dataclass
class Run:
    """One command's run: what it is doing (for the line Ctrl-C prints) and the table it
    writes, with the version it started from."""

    args: argparse.Namespace
    bars: ProgressBars | None = None
    doing: str = ""
    writes: str | None = None  # the table a writing command changes
    storage_options: dict[str, str] | None = field(
        default=None, repr=False
    )  # credentials: never printed
    branch: str | None = None
    version_before: int | None = None
    existed_before: bool = True
    started: float = field(default_factory=time.time)
    had_spark: bool = field(default_factory=lambda: _spark_context() is not None)

    def status(self, message: str) -> None:
        """A line on stderr; also what an interrupt reports as happening."""
        if STARTING_AS_COMMAND:  # Spark, once started, put its own handler in front
            CTRL_C.install()
        self.doing = message.removesuffix(" ...").removesuffix("...")
        if self.bars is not None:
            self.bars.message(message)
        else:
            print(message, file=sys.stderr, flush=True)

    def progress(self, event: ProgressEvent) -> None:
        if self.bars is not None:
            self.bars(event)

    def will_write(self, uri: str, options, branch: str | None = None) -> None:
        """Remember ``uri``'s version now, to tell after Ctrl-C what was committed."""
        from blobhouse.io.objects import is_local, uri_to_path

        self.writes, self.storage_options, self.branch = uri, options, branch
        self.version_before = _version_of(uri, options, branch)
        self.existed_before = not is_local(uri) or os.path.exists(uri_to_path(uri))

    def interrupted(self) -> int:
        """After Ctrl-C: stop Spark quietly, then one line saying what was true."""
        if STARTING_AS_COMMAND:  # Spark's handler would raise again: more are absorbed
            CTRL_C.absorb()
        if self.bars is not None:
            self.bars.close()
        _silence_python_logging()
        _SPARK_OUTPUT.mute()
        stopped = _stop_spark() if not self.had_spark else False
        print(
            f"interrupted{': ' + self.doing if self.doing else ''}; {self._outcome(stopped)}",
            file=sys.stderr,
            flush=True,
        )
        return INTERRUPTED

    def _outcome(self, spark_stopped: bool) -> str:
        command = self.args.command
        if command in ("stats", "verify") or (command == "gc" and self.args.dry_run):
            return "nothing was changed"
        if command == "gc":
            return (
                "the table reads as before (gc removes only what no retained version "
                "references); run gc again to finish"
            )
        if self.writes is None:
            return "nothing was committed"
        try:
            after = _version_of(self.writes, self.storage_options, self.branch)
        except Exception:
            return f"could not check {self.writes} afterwards"
        if after == self.version_before:
            if after is None:
                # Spark stopped on this machine, or none ran: no task still writes there
                if _spark_context() is None and (self._local_master() or not spark_stopped):
                    _tidy_failed_create(self.writes, self.started, self.existed_before)
                return "nothing was committed (no table was created)"
            return f"nothing was committed ({self.writes} stays at version {after})"
        return f"version {after} of {self.writes} had been committed before that"

    def _local_master(self) -> bool:
        return getattr(self.args, "master", "local").startswith("local")

    def failed(self, exc: BaseException) -> int:
        """An error as one line on stderr (with the traceback under ``--debug``)."""
        if self.bars is not None:
            self.bars.close()
        _silence_python_logging()
        if self.args.debug:
            traceback.print_exception(exc, file=sys.stderr)
        message = one_line(exc, self.args.command)  # may ask the JVM: before Spark stops
        if not self.had_spark:
            _SPARK_OUTPUT.mute()
            _stop_spark()
        print(f"error: {message}", file=sys.stderr, flush=True)
        return 2 if _expected(exc) else 1


def one_line(exc: BaseException, command: str = "") -> str:
    """The message of ``exc`` as one line: a blobhouse error raised in a Spark task or
    process is found inside the Java exception that carries it.

    >>> one_line(ValueError("bad\\nthing"))
    'ValueError: bad (--debug prints the traceback)'
    """
    if _missing_spark(exc):
        return f'blobhouse {command or "on Spark"} needs Spark: pip install "blobhouse[spark]"'
    if isinstance(exc, BlobhouseError):  # ours: whole, what to do is at its end
        return _first_line(str(exc), limit=None)
    text = str(exc)
    inner = re.findall(r"blobhouse\.errors\.\w+: ([^\n]+)", text)
    if inner:
        return inner[-1].strip()
    if "JAVA_GATEWAY_EXITED" in text:
        said = _SPARK_OUTPUT.startup_error()
        return "could not start Spark: " + (
            said or "its Java process exited (is Java 17 installed, on PATH or in JAVA_HOME?)"
        )
    java = getattr(exc, "java_exception", None)
    if java is not None:
        with contextlib.suppress(Exception):
            text = str(java.toString())
    line = _first_line(text)
    return f"{type(exc).__name__}: {line} (--debug prints the traceback)"


def _first_line(text: str, limit: int | None = 1000) -> str:
    """The first line of ``text``, cut at ``limit`` characters (a Java exception's line can
    run to many kilobytes)."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    line = lines[0] if lines else "(no message)"
    return line[: limit - 3] + "..." if limit is not None and len(line) > limit else line


def _expected(exc: BaseException) -> bool:
    """Bad input and environments (exit 2), as opposed to bugs (exit 1)."""
    return (
        isinstance(exc, BlobhouseError | OSError)
        or _missing_spark(exc)
        or re.search(r"blobhouse\.errors\.\w+: |JAVA_GATEWAY_EXITED", str(exc)) is not None
    )


def _missing_spark(exc: BaseException) -> bool:
    """pyspark is not installed (an old one is a MissingExtraError saying which it found)."""
    if isinstance(exc, MissingExtraError):
        return isinstance(exc.__cause__, ImportError)
    return isinstance(exc, ImportError) and (getattr(exc, "name", None) or "").split(".")[0] in (
        "pyspark",
        "py4j",
    )


def storage_options(args: argparse.Namespace) -> dict[str, str] | None:
    from blobhouse.io.objects import checked_options

    return checked_options(pairs(args.storage_option, "--storage-option", "NAME=VALUE"))


def pairs(items: list[str], flag: str, shape: str) -> dict[str, str]:
    pairs = [item.split("=", 1) for item in items]
    bad = [item for item, pair in zip(items, pairs, strict=True) if len(pair) != 2 or not pair[0]]
    if bad:
        raise InvalidInputError(f"{flag} must be {shape}, got {bad[0]!r}")
    return dict(pairs)


def _version_of(uri: str, options, branch: str | None = None) -> int | None:
    from blobhouse.table import open_table

    try:
        return open_table(uri, storage_options=options, branch=branch).version
    except Exception:  # no table (or none readable): only a message depends on it
        return None


LOG4J_PROPERTIES = """\
# blobhouse's command line: Spark's JVM logs nothing on the terminal (errors reach Python and
# are printed as one line); --debug keeps Spark's own logging
status = off
rootLogger.level = off
rootLogger.appenderRef.stderr.ref = stderr
appender.stderr.type = Console
appender.stderr.name = stderr
appender.stderr.target = SYSTEM_ERR
appender.stderr.layout.type = PatternLayout
appender.stderr.layout.pattern = %m%n
logger.apache.name = org.apache
logger.apache.level = off
logger.sparkproject.name = org.sparkproject
logger.sparkproject.level = off
logger.netty.name = io.netty
logger.netty.level = off
"""


def spark_conf(args: argparse.Namespace) -> dict[str, str]:
    """Spark settings of a command: quiet (no JVM logs, no console progress bar: ours shows
    the tasks) unless ``--debug``; then the user's ``--conf`` on top."""
    given = pairs(args.conf, "--conf", "KEY=VALUE")
    conf = {"spark.ui.showConsoleProgress": "false"}
    if not args.debug:
        quiet = f"-Dlog4j2.configurationFile={_log4j_file()}"
        theirs = given.pop("spark.driver.extraJavaOptions", "")
        conf["spark.driver.extraJavaOptions"] = f"{quiet} {theirs}".strip()
    return {**conf, **given}


_LOG4J: list[str] = []


def _log4j_file() -> str:
    if not _LOG4J:
        fd, path = tempfile.mkstemp(prefix="blobhouse-log4j2-", suffix=".properties")
        with os.fdopen(fd, "w") as f:
            f.write(LOG4J_PROPERTIES)
        atexit.register(lambda: os.path.exists(path) and os.remove(path))
        _LOG4J.append(path)
    return _LOG4J[0]


def check_master(master: str) -> None:
    """A ``spark://`` master that does not answer is an error now, not after Spark's minute of
    retries."""
    if not master.startswith("spark://"):
        return
    problem: OSError | None = None
    for address in master.removeprefix("spark://").split(","):
        host, _, port = address.rpartition(":")
        try:
            socket.create_connection((host or address, int(port or 7077)), timeout=5).close()
            return
        except ValueError:
            raise InvalidInputError(f"--master {master}: {address!r} is not host:port") from None
        except OSError as exc:
            problem = exc
    reason = getattr(problem, "strerror", None) or str(problem) or type(problem).__name__
    raise InvalidInputError(
        f"cannot reach the Spark master {master}: {reason} (is it running? see "
        "docs/spark-cluster.md)"
    )


class _SparkOutput:
    """What Spark's JVM (and the Python workers it starts) print on stderr, relayed line by
    line: held back while the JVM starts (a failed start becomes one line of the error instead),
    without the JVM's notice about incubator modules, and nothing once Ctrl-C was pressed
    (killed tasks' workers print broken-pipe tracebacks)."""

    NOISE = (b"WARNING: Using incubator modules",)

    def __init__(self) -> None:
        self.muted = threading.Event()
        self.lock = threading.Lock()
        self.held: list[bytes] | None = None  # lines of a start in progress
        self.failed_start: list[str] = []

    def mute(self) -> None:
        self.muted.set()

    def launch(self, original, conf, popen_kwargs):
        """pyspark's ``launch_gateway``, with the JVM's stderr through this relay. A start
        that fails or is interrupted kills the JVM: pyspark removes the file the JVM reports
        its port in, and a JVM that cannot write it never exits (its gateway thread waits)."""
        import pyspark.java_gateway as java_gateway

        read, write = os.pipe()
        with self.lock:
            self.held = []
        ended = threading.Event()
        threading.Thread(target=self._copy, args=(read, ended), daemon=True).start()
        popen, started = getattr(java_gateway, "Popen", None), []

        def remembered(*args, **kwargs):
            started.append(popen(*args, **kwargs))
            return started[-1]

        if popen is not None:
            java_gateway.Popen = remembered
        try:
            gateway = original(conf, {**(popen_kwargs or {}), "stderr": write})
        except BaseException:
            for process in started:
                _kill_tree(process.pid)
            os.close(write)
            ended.wait(timeout=5)  # the JVM exited: its last lines are in
            with self.lock:
                self.failed_start = [line.decode(errors="replace") for line in self.held or []]
                self.held = None
            raise
        finally:
            if popen is not None:
                java_gateway.Popen = popen
        os.close(write)  # the JVM holds its own copy
        with self.lock:
            held, self.held = self.held or [], None
            for line in held:
                self._write(line)
        return gateway

    def startup_error(self) -> str | None:
        """The line saying why the JVM did not start, if it said."""
        for line in self.failed_start:
            if re.search(r"(Exception|Error)\b", line):
                return line.strip().removeprefix('Exception in thread "main" ')
        return None

    def _copy(self, fd: int, ended: threading.Event) -> None:
        with contextlib.suppress(Exception), os.fdopen(fd, "rb") as stream:
            for line in iter(stream.readline, b""):
                with self.lock:
                    if self.held is not None:
                        self.held.append(line)
                    else:
                        self._write(line)
        ended.set()

    def _write(self, line: bytes) -> None:
        if not self.muted.is_set() and not line.startswith(self.NOISE):
            with contextlib.suppress(OSError):
                os.write(sys.__stderr__.fileno() if sys.__stderr__ else 2, line)


_SPARK_OUTPUT = _SparkOutput()


@contextlib.contextmanager
def spark_output(args: argparse.Namespace) -> Iterator[None]:
    """While a command starts Spark (unless ``--debug``): the JVM's stderr goes through
    :class:`_SparkOutput` (pyspark's ``launch_gateway`` takes ``popen_kwargs`` for this)."""
    try:
        import pyspark.core.context as context_module
    except ImportError:
        yield
        return
    original = getattr(context_module, "launch_gateway", None)
    if args.debug or original is None:
        yield
        return

    def launch(conf=None, popen_kwargs=None):
        return _SPARK_OUTPUT.launch(original, conf, popen_kwargs)

    context_module.launch_gateway = launch
    unregister = when_interrupted(_SPARK_OUTPUT.mute)
    try:
        yield
    finally:
        context_module.launch_gateway = original
        unregister()


def start_spark(args: argparse.Namespace, run: Run):
    import blobhouse.spark as bs

    run.status(f"starting Spark ({args.master}) ...")
    spark = bs.local_session(args.master, conf=spark_conf(args))
    bs.register(spark, storage_options=storage_options(args))
    return spark


def _kill_tree(pid: int) -> None:
    """Kill process ``pid`` and every process below it: spark-submit's shell runs a launcher
    JVM before Spark's, and killing the shell alone leaves that one running."""
    below, frontier = set(), {pid}
    parents = _parents()
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - below
        below |= frontier
    for each in (pid, *below):
        with contextlib.suppress(OSError):
            os.kill(each, signal.SIGKILL)


def _parents() -> dict[int, int]:
    """Every process's parent, from /proc (empty where there is none: the shell alone goes)."""
    parents = {}
    with contextlib.suppress(OSError):
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                with (
                    contextlib.suppress(OSError, IndexError, ValueError),
                    open(f"/proc/{entry}/stat") as stat,
                ):
                    parents[int(entry)] = int(stat.read().rsplit(")", 1)[1].split()[1])
    return parents


def _spark_context():
    """The running SparkContext, if pyspark was imported and started one."""
    module = sys.modules.get("pyspark")
    return getattr(getattr(module, "SparkContext", None), "_active_spark_context", None)


def _stop_spark() -> bool:
    """Stop the Spark session this command started (quietly); whether one was stopped."""
    context = _spark_context()
    if context is None:
        return False
    with contextlib.suppress(Exception):
        context.stop()
    return True


def _tidy_failed_create(uri: str, since: float, existed: bool) -> None:
    """After an interrupted create on a local path with Spark stopped: the abort markers the
    write left (``data/aborted-*``) and the empty directories it made go too, so the path is as
    before (the write's staged files were removed by its abort)."""
    from blobhouse.io.objects import is_local, uri_to_path
    from blobhouse.layout import aborted_marker

    if not is_local(uri):
        return
    root = uri_to_path(uri)
    data = os.path.join(root, "data")
    if os.path.isdir(data):
        for name in os.listdir(data):
            path = os.path.join(data, name)
            if name.startswith(aborted_marker("")) and os.path.getmtime(path) >= since - 1:
                with contextlib.suppress(OSError):
                    os.remove(path)
    for folder, _, _ in sorted(os.walk(root), key=lambda entry: -len(entry[0])):
        made_now = os.path.getmtime(folder) >= since - 1  # (a removal touched it)
        if (folder != root and made_now) or (folder == root and not existed):
            with contextlib.suppress(OSError):
                os.rmdir(folder)  # only empty ones


class _OneLineLogs(logging.Handler):
    """Python logging on the command line: py4j's and pyspark's records (its tracebacks of
    connections a Ctrl-C cut) are dropped, others print as ``warning: ...`` lines."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.silent = False

    def emit(self, record: logging.LogRecord) -> None:
        noisy = record.name.startswith(("py4j", "pyspark")) or (
            f"{os.sep}py4j{os.sep}" in (record.pathname or "")
        )
        if self.silent or noisy:
            return
        print(f"warning: {_first_line(record.getMessage())}", file=sys.stderr, flush=True)


_HANDLERS: list[_OneLineLogs] = []


@contextlib.contextmanager
def command_logging(debug: bool) -> Iterator[None]:
    """Python logging for one command; with ``--debug`` Python's defaults stay."""
    if debug:
        yield
        return
    handler = _OneLineLogs()
    root = logging.getLogger()
    root.addHandler(handler)  # a handler of its own: logging.exception adds none to stderr
    _HANDLERS.append(handler)
    unregister = when_interrupted(_silence_python_logging)
    shown = warnings.showwarning
    warnings.showwarning = _one_line_warning
    try:
        yield
    finally:
        warnings.showwarning = shown
        unregister()
        _HANDLERS.remove(handler)
        root.removeHandler(handler)


def _one_line_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """A Python warning as one line, ``warning: ...``, without the source line it came from."""
    print(f"warning: {_first_line(str(message))}", file=sys.stderr, flush=True)


def _silence_python_logging() -> None:
    for handler in _HANDLERS:
        handler.silent = True

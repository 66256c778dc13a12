"""Fixtures shared by tests/ and the package doctests: one local Spark session for the run."""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile

import pytest

# a script of LeRobot's environment (.venv-lerobot): it imports lerobot where it starts, as the
# training scripts it stands for do, so it cannot be imported for its doctests here
collect_ignore = ["bench/lerobot_env/train_dropin.py"]

_RUN_TMP = pytest.StashKey[str]()
_RUN_PREFIX = "blobhouse-tests-"
_OWNER = "owner.pid"


def _remove_folders_of_ended_runs(keep: int) -> None:
    """Removes the run folders whose pytest process has ended, newest ``keep`` kept: the disk
    of a machine (and of CI on it) filled up with the gigabytes of failed runs."""
    root = tempfile.gettempdir()
    ended = []
    for name in os.listdir(root):
        path = os.path.join(root, name)
        if name.startswith(_RUN_PREFIX) and os.path.isdir(path) and not _running(path):
            ended.append(path)
    ended.sort(key=os.path.getmtime, reverse=True)
    for path in ended[keep:]:
        shutil.rmtree(path, ignore_errors=True)


def _running(run_tmp: str) -> bool:
    try:
        with open(os.path.join(run_tmp, _OWNER)) as owner:
            pid = int(owner.read())
        os.kill(pid, 0)
    except PermissionError:  # alive, another user's
        return True
    except (OSError, ValueError):
        return False
    return True


def pytest_configure(config: pytest.Config) -> None:
    """Every temporary file of the run (tests' ``tmp_path``, doctests' ``mkdtemp``, child
    processes', the Spark JVMs' scratch) goes under one directory, removed when the run
    passes: a run used to leave ~200 directories and gigabytes in /tmp. Folders that failed
    or killed runs left are removed when a later run starts, but for the newest one. The
    workers of a parallel run (pytest-xdist, ``bin/test``) share their controller's folder:
    they inherit its environment, and the controller removes the folder."""
    if hasattr(config, "workerinput"):
        return
    _remove_folders_of_ended_runs(keep=1)
    run_tmp = tempfile.mkdtemp(prefix=_RUN_PREFIX)
    with open(os.path.join(run_tmp, _OWNER), "w") as owner:
        owner.write(str(os.getpid()))
    config.stash[_RUN_TMP] = run_tmp
    tempfile.tempdir = run_tmp
    os.environ["TMPDIR"] = run_tmp  # Python children: multiprocessing, fresh processes
    os.environ["SPARK_LOCAL_DIRS"] = run_tmp  # Spark's scratch (shuffle, python workers)
    java_tmp = f"-Djava.io.tmpdir={run_tmp}"  # drivers launched by pyspark's spark-submit
    os.environ["SPARK_SUBMIT_OPTS"] = f"{os.environ.get('SPARK_SUBMIT_OPTS', '')} {java_tmp}"
    os.environ["SPARK_DAEMON_JAVA_OPTS"] = (  # standalone masters and workers
        f"{os.environ.get('SPARK_DAEMON_JAVA_OPTS', '')} {java_tmp}"
    )


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """A passing run's temporary files are removed; a failing run's are kept to look at."""
    run_tmp = session.config.stash.get(_RUN_TMP, None)
    if run_tmp is None:
        return
    if exitstatus == 0:
        # multiprocessing removes its own folder (pymp-*) at exit, after this hook: removing
        # it here made its finalizer print a traceback; the emptied run folder goes next run
        # (a parallel run's workers may still be removing files of their own: faulthandler's)
        for name in os.listdir(run_tmp):
            if not name.startswith("pymp-"):
                path = os.path.join(run_tmp, name)
                if os.path.isdir(path) and not os.path.islink(path):
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(path)
    else:
        print(f"\nthe failed run's temporary files are in {run_tmp}", file=sys.stderr)


@pytest.fixture(scope="session")
def spark(tmp_path_factory):
    """A local Spark session on loopback, created once, with blobhouse registered (its SQL
    warehouse, which catalog tables create, in a temporary directory, not the checkout)."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    from blobhouse.spark import local_session, register

    warehouse = tmp_path_factory.mktemp("spark-warehouse")
    session = local_session(
        master="local[2]",
        shuffle_partitions=4,
        conf={"spark.sql.warehouse.dir": str(warehouse)},
    )
    register(session)
    yield session
    session.stop()


@pytest.fixture(autouse=True)
def _spark_for_doctests(request, doctest_namespace):
    """Spark doctests get ``spark``; other tests do not start it."""
    if request.node.nodeid.startswith("blobhouse/spark"):
        doctest_namespace["spark"] = request.getfixturevalue("spark")

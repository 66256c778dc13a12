"""The package's metadata fits other environments (ranges, Spark as an extra, Python 3.11 to
3.13), the repository's environment is the tested one (constraints.txt), and blobhouse works
without pyspark, saying which extra adds Spark when it is asked for."""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
import tempfile
import textwrap
import time
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

from tests.helpers import ROOT

PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
DEPENDENCIES = [Requirement(r) for r in PROJECT["dependencies"]]
EXTRAS = {
    extra: [Requirement(r) for r in requirements]
    for extra, requirements in PROJECT["optional-dependencies"].items()
}
# what the tests need pinned: the package's dependencies, pyspark and the test tools
TESTED = [
    "pylance",
    "pyarrow",
    "numpy",
    "pandas",
    "blake3",
    "obstore",
    "pyroaring",
    "rich",
    "pyspark",
    "moto",
    "lancedb",
    "pytest",
]


def constraints() -> dict[str, str]:
    """constraints.txt as {canonical name: pinned version}."""
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        requirement = Requirement(line)
        specifiers = list(requirement.specifier)
        assert len(specifiers) == 1 and specifiers[0].operator == "==", f"not a pin: {line}"
        name = canonicalize_name(requirement.name)
        assert name not in pins, f"pinned twice: {name}"
        pins[name] = specifiers[0].version
    return pins


def test_python_311_to_313_are_supported():
    supported = SpecifierSet(PROJECT["requires-python"])
    for version in ("3.11.0", "3.12.0", "3.13.0", "3.13.9"):
        assert version in supported, (version, supported)
    assert "3.10.13" not in supported


def test_dependencies_are_ranges_and_pyspark_is_only_in_the_spark_extra():
    names = [canonicalize_name(r.name) for r in DEPENDENCIES]
    assert "pyspark" not in names
    assert "rich" in names
    for requirement in DEPENDENCIES:
        operators = {s.operator for s in requirement.specifier}
        assert not operators & {"==", "==="}, f"{requirement} is an exact pin"
        assert ">=" in operators, f"{requirement} has no lower bound"
    (spark,) = EXTRAS["spark"]
    assert canonicalize_name(spark.name) == "pyspark"
    assert "4.1.0" in spark.specifier and "4.0.5" not in spark.specifier
    for extra, requirements in EXTRAS.items():
        if extra != "spark":
            assert "pyspark" not in {canonicalize_name(r.name) for r in requirements}, extra


def test_constraints_pin_tested_versions_inside_the_ranges():
    pins = constraints()
    missing = [name for name in TESTED if name not in pins]
    assert not missing, f"constraints.txt pins none of {missing}"
    for requirement in DEPENDENCIES + [r for rs in EXTRAS.values() for r in rs]:
        name = canonicalize_name(requirement.name)
        assert name in pins, f"constraints.txt does not pin {name}"
        assert requirement.specifier.contains(pins[name], prereleases=True), (
            f"constraints.txt pins {name}=={pins[name]}, outside {requirement}"
        )


def test_the_repository_environment_has_exactly_the_pinned_versions():
    if Path(sys.prefix).resolve() != (ROOT / ".venv").resolve():
        pytest.skip("not the repository's .venv (bin/bootstrap)")
    different = {}
    for name, version in constraints().items():
        try:
            installed = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue  # a pin for another Python version (overrides is for 3.11 only)
        if installed != version:
            different[name] = (installed, version)
    assert not different, f"installed versus constraints.txt: {different}"


# Runs Python with every ``pyspark`` import failing as if it were not installed.
WITHOUT_PYSPARK = textwrap.dedent(
    """
    import sys

    class NoPyspark:
        def find_spec(self, name, path=None, target=None):
            if name == "pyspark" or name.startswith("pyspark."):
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)

    sys.meta_path.insert(0, NoPyspark())
    """
)


def run_without_pyspark(code: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", WITHOUT_PYSPARK + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )


def test_core_works_without_pyspark_and_spark_names_its_extra():
    done = run_without_pyspark(
        """
        import pkgutil
        import blobhouse
        from blobhouse.errors import BlobhouseError, MissingExtraError

        core = [m.name for m in pkgutil.walk_packages(blobhouse.__path__, "blobhouse.")
                if not m.name.startswith(("blobhouse.spark", "blobhouse.torch",
                                          "blobhouse.lerobot.dataset"))]  # torch's
        for name in core:  # the CLI, the demo's generator, blobhouse.testing included
            __import__(name)
        assert not [m for m in sys.modules if m.split(".")[0] == "pyspark"]
        assert "blobhouse.cli" in core and "blobhouse.cli.demo" in core

        try:
            import blobhouse.spark
        except MissingExtraError as error:
            assert isinstance(error, ImportError) and isinstance(error, BlobhouseError)
            print(error)
        else:
            raise AssertionError("blobhouse.spark imported without pyspark")
        """
    )
    assert done.returncode == 0, done.stderr
    message = done.stdout.strip()
    assert len(message.splitlines()) == 1
    assert 'pip install "blobhouse[spark]"' in message
    assert "needs pyspark" in message


def test_a_pyspark_older_than_4_1_is_named():
    done = run_without_pyspark(
        """
        import types
        old = types.ModuleType("pyspark")  # a module, not a package: no pyspark.sql.datasource
        old.__version__ = "3.5.1"
        sys.modules["pyspark"] = old
        from blobhouse.errors import MissingExtraError
        try:
            import blobhouse.spark.datasource
        except MissingExtraError as error:
            print(error)
        """
    )
    assert done.returncode == 0, done.stderr
    assert "pyspark 4.1 or later (this is pyspark 3.5.1)" in done.stdout
    assert "blobhouse[spark]" in done.stdout


def test_blobhouse_torch_without_torch_names_its_extra():
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            WITHOUT_PYSPARK.replace("pyspark", "torch")
            + textwrap.dedent(
                """
                from blobhouse.errors import MissingExtraError
                import blobhouse.loader  # the loader needs no torch
                try:
                    import blobhouse.torch
                except MissingExtraError as error:
                    print(error)
                """
            ),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == (
        'blobhouse.torch needs torch, which is not installed: pip install "blobhouse[torch]"'
    )


def test_the_demo_without_pyspark_is_one_line_naming_the_extra(tmp_path):
    done = run_without_pyspark(
        f"""
        from blobhouse.cli import main
        sys.exit(main(["demo", "--rows", "30", "--out", {str(tmp_path / "demo")!r}]))
        """
    )
    assert done.returncode == 2, done.stderr
    assert "blobhouse[spark]" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert not (tmp_path / "demo").exists()


def test_a_test_run_keeps_its_temporary_files_in_one_folder(tmp_path):
    """conftest.py points this process, its children and the Spark JVMs at one folder per run
    (removed when the run passes), so tests leave nothing behind in the system's /tmp."""
    run_tmp = tempfile.gettempdir()
    assert os.path.basename(run_tmp).startswith("blobhouse-tests-")
    assert str(tmp_path).startswith(run_tmp)
    child = subprocess.run(
        [sys.executable, "-c", "import tempfile; print(tempfile.gettempdir())"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert child.stdout.strip() == run_tmp
    assert f"-Djava.io.tmpdir={run_tmp}" in os.environ["SPARK_SUBMIT_OPTS"]
    assert os.environ["SPARK_LOCAL_DIRS"] == run_tmp
    # the folder's owner is the run's pytest process: a parallel run's controller, which
    # started this worker, or this process
    owner_pid = os.getppid() if "PYTEST_XDIST_WORKER" in os.environ else os.getpid()
    with open(os.path.join(run_tmp, "owner.pid")) as owner:
        assert int(owner.read()) == owner_pid


def test_a_test_run_removes_the_folders_of_ended_runs_but_the_newest(tmp_path):
    """Failed and killed runs keep their folder to look at; the next run removes all but the
    newest of them, never one of a run still going (a full run writes gigabytes)."""
    folders = {}
    for age, name, pid in [
        (300, "old-failed", 999_999_999),
        (200, "killed-without-owner", None),
        (100, "newest-failed", 999_999_999),
        (400, "still-running", os.getpid()),
    ]:
        folder = tmp_path / f"blobhouse-tests-{name}"
        folder.mkdir()
        if pid is not None:
            (folder / "owner.pid").write_text(str(pid))
        os.utime(folder, (time.time() - age, time.time() - age))
        folders[name] = folder
    (tmp_path / "someone-elses").mkdir()
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    subprocess.run(
        [sys.executable, "-c", "import conftest; conftest._remove_folders_of_ended_runs(keep=1)"],
        cwd=root,
        env={**os.environ, "TMPDIR": str(tmp_path)},
        check=True,
    )
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == [
        "blobhouse-tests-newest-failed",
        "blobhouse-tests-still-running",
        "someone-elses",
    ]

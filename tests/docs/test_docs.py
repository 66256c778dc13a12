"""The documentation runs as written: every Python block of README.md and docs/*.md, every
relative link, the README's quick start, and its performance figures are the recorded run's."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
PAGES = [README, *sorted(DOCS.glob("*.md"))]
LINKED = [README, ROOT / "CONTRIBUTING.md", ROOT / "BENCHMARKS.md", *sorted(DOCS.glob("*.md"))]

FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```", flags=re.S | re.M)
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def python_blocks(page: Path) -> list[tuple[int, str]]:
    """The page's ```python blocks with the line each starts on."""
    text = page.read_text()
    return [
        (text.count("\n", 0, m.start(2)), m.group(2))
        for m in FENCE.finditer(text)
        if m.group(1) == "python"
    ]


def uses_spark(page: Path) -> bool:
    return any("blobhouse.spark" in block for _, block in python_blocks(page))


def _page_param(page: Path):
    marks = [pytest.mark.spark] if uses_spark(page) else []
    return pytest.param(page, id=str(page.relative_to(ROOT)), marks=marks)


@pytest.mark.parametrize("page", [_page_param(p) for p in PAGES if python_blocks(p)])
def test_python_blocks_run(page: Path, request):
    """A page is a tutorial: its blocks run in order in one namespace. Spark blocks get the
    run's session: ``blobhouse.spark.local_session()`` returns the session the ``spark``
    fixture started (``getOrCreate``), whose SQL warehouse is a temporary directory."""
    if uses_spark(page):
        request.getfixturevalue("spark")
    namespace: dict = {"__name__": "__docs__"}
    for line, block in python_blocks(page):
        # pad with blank lines so a traceback names the line of the page
        exec(compile("\n" * line + block, str(page), "exec"), namespace)


def test_readme_and_docs_have_python_examples():
    assert python_blocks(README), "the README has no Python example"
    assert uses_spark(README), "the README shows Spark"


def test_readme_starts_with_the_two_commands():
    text = README.read_text()
    quick = text.split("```sh\n", 1)[1].split("```", 1)[0].strip().splitlines()
    assert [line.split("#")[0].strip() for line in quick] == ["bin/blobhouse demo", "bin/test"]
    ci = (ROOT / ".ci" / "run").read_text()
    assert ci.strip().splitlines()[-1] == "bin/test"


def test_readme_performance_is_the_recorded_runs():
    """README's performance headline is what bench/report.py writes from the recorded results
    (bench/results/*.json, the run BENCHMARKS.md shows), not figures copied by hand:
    ``bin/bench`` rewrites it with BENCHMARKS.md."""
    from bench.report import readme_headline, with_headline

    text = README.read_text()
    assert with_headline(text, readme_headline(ROOT / "bench" / "results")) == text, (
        "README.md's performance block is not the recorded run's: python -m bench.report"
    )


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = FENCE.sub("", page.read_text())
    seen: dict[str, int] = {}
    out = set()
    for heading in re.findall(r"^#{1,6} (.+)$", text, flags=re.M):
        base = slug(heading)
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


@pytest.mark.parametrize("page", LINKED, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page: Path):
    broken = []
    for target in LINK.findall(FENCE.sub("", page.read_text())):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(f"{target}: no file {file}")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            broken.append(f"{target}: no heading #{anchor} in {file.name}")
    assert not broken, f"{page.name}: " + "; ".join(broken)


def test_index_lists_every_page():
    index = (DOCS / "index.md").read_text()
    linked = {Path(t.partition("#")[0]).name for t in LINK.findall(index)}
    pages = {p.name for p in DOCS.glob("*.md")} - {"index.md"}
    assert pages <= linked, f"docs/index.md does not list {sorted(pages - linked)}"


def test_the_module_map_lists_every_module():
    """docs/architecture.md names every module of the package (and no module that is gone);
    a package's ``__init__.py`` that only names its modules needs no row."""
    package = ROOT / "blobhouse"
    modules = {
        str(p.relative_to(package))
        for p in package.rglob("*.py")
        if p.name != "__init__.py" or re.search(r"^(def|class) ", p.read_text(), flags=re.M)
    }
    text = (DOCS / "architecture.md").read_text()
    mapped = set(re.findall(r"^\| `([\w/]+\.py)` \|", text, flags=re.M))
    assert modules - mapped == set(), "modules missing from docs/architecture.md"
    assert mapped - modules == set(), "docs/architecture.md names modules that are gone"

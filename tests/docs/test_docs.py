"""The README's Python example runs as written."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"


def test_readme_python_examples_run(spark):
    """With the session fixture: the examples' local_session() is that session, whose SQL
    warehouse (CREATE TABLE) is a temporary directory."""
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert blocks, "the README has no Python example"
    for block in blocks:
        exec(compile(block, str(README), "exec"), {})


def test_readme_starts_with_the_two_commands():
    text = README.read_text()
    quick = text.split("```sh\n", 1)[1].split("```", 1)[0].strip().splitlines()
    assert [line.split("#")[0].strip() for line in quick] == ["bin/blobhouse demo", "bin/test"]
    ci = (README.parent / ".ci" / "run").read_text()
    assert ci.strip().splitlines()[-1] == "bin/test"

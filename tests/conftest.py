"""Fixtures of tests/ (the Spark session fixture is in the repository's conftest.py)."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def table_uri(tmp_path: Path) -> str:
    """Where a test's table lives (not created yet)."""
    return str(tmp_path / "table")

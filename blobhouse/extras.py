"""The optional parts of blobhouse and the extras that install them.

``pip install blobhouse`` is the Python library (tables, dedup, object stores, the table
services); ``pip install "blobhouse[spark]"`` adds pyspark for :mod:`blobhouse.spark`,
``blobhouse ingest`` and ``blobhouse demo``; ``pip install "blobhouse[torch]"`` adds torch for
:mod:`blobhouse.torch`; ``pip install "blobhouse[video]"`` adds PyAV for decoded video frames
(:mod:`blobhouse.read.video`) and Pillow for LeRobot's image features. :func:`require_spark`,
:func:`require_torch`, :func:`require_av` and :func:`require_pillow` turn a missing (or too
old) package into a :class:`~blobhouse.errors.MissingExtraError` that says so in one line.
"""

from __future__ import annotations

import importlib

from blobhouse.errors import MissingExtraError

SPARK_EXTRA = 'pip install "blobhouse[spark]"'
TORCH_EXTRA = 'pip install "blobhouse[torch]"'
VIDEO_EXTRA = 'pip install "blobhouse[video]"'
# the Python data source API blobhouse.spark is built on, with filter pushdown: Spark 4.1
SPARK_MIN_VERSION = (4, 1)


def require_spark(what: str = "blobhouse.spark") -> None:
    """Returns if a pyspark that ``what`` can use is installed; otherwise raises
    :class:`MissingExtraError` naming the extra that installs one."""
    try:
        import pyspark
    except ImportError as error:
        raise MissingExtraError(
            f"{what} needs pyspark, which is not installed: {SPARK_EXTRA}"
        ) from error
    version = getattr(pyspark, "__version__", "")
    if _release(version) < SPARK_MIN_VERSION:
        raise MissingExtraError(
            f"{what} needs pyspark {'.'.join(map(str, SPARK_MIN_VERSION))} or later "
            f"(this is pyspark {version or 'of no version'}): "
            f"{SPARK_EXTRA}"
        )


def require_torch(what: str = "blobhouse.torch") -> None:
    """Returns if torch is installed; otherwise raises :class:`MissingExtraError` naming the
    extra that installs it."""
    _require("torch", f"{what} needs torch", TORCH_EXTRA)


def require_av(what: str = "decoded video frames") -> None:
    """Returns if PyAV is installed; otherwise raises :class:`MissingExtraError` naming the
    extra that installs it."""
    _require("av", f"{what} need PyAV", VIDEO_EXTRA)


def require_pillow(what: str = "LeRobot's image features") -> None:
    """Returns if Pillow is installed; otherwise raises :class:`MissingExtraError` naming the
    extra that installs it."""
    _require("PIL", f"{what} need Pillow", VIDEO_EXTRA)


def _require(module: str, needs: str, extra: str) -> None:
    try:
        importlib.import_module(module)
    except ImportError as error:
        raise MissingExtraError(f"{needs}, which is not installed: {extra}") from error


def _release(version: str) -> tuple[int, ...]:
    """``"4.1.0.dev0"`` -> ``(4, 1)``; anything unreadable -> ``()``."""
    parts = []
    for part in version.split(".")[:2]:
        if not part.isdigit():
            break
        parts.append(int(part))
    return tuple(parts)

"""LeRobot datasets as blobhouse tables: :func:`ingest_lerobot` imports one (its v3 layout:
meta/ JSON and Parquet, data/ Parquet, videos/ MP4) with each video file stored once and the
dataset's metadata kept with the table (:func:`dataset_info`);
:class:`~blobhouse.lerobot.dataset.LeRobotDataset` reads it as LeRobot's class of the same name
does (``from blobhouse.lerobot import LeRobotDataset``: needs torch);
:class:`~blobhouse.lerobot.source.LeRobotSource` reads and checks a dataset folder;
:func:`export_lerobot` writes a table back as a LeRobot dataset folder;
:func:`~blobhouse.lerobot.sample.write_sample_dataset` writes a synthetic one.
"""

from typing import Any

from blobhouse.lerobot.export import LeRobotExport, export_lerobot
from blobhouse.lerobot.info import DatasetInfo, LeRobotDatasetMetadata, dataset_info
from blobhouse.lerobot.ingest import LeRobotImport, ingest_lerobot
from blobhouse.lerobot.source import LeRobotSource, column_name

__all__ = [
    "DatasetInfo",
    "LeRobotDataset",
    "LeRobotDatasetMetadata",
    "LeRobotExport",
    "LeRobotImport",
    "LeRobotSource",
    "column_name",
    "dataset_info",
    "export_lerobot",
    "ingest_lerobot",
]

_WITH_TORCH = ("LeRobotDataset",)


def __getattr__(name: str) -> Any:
    # the reader needs torch, the import does not: loaded on first use
    if name in _WITH_TORCH:
        from blobhouse.lerobot import dataset

        return getattr(dataset, name)
    raise AttributeError(f"module 'blobhouse.lerobot' has no attribute {name!r}")

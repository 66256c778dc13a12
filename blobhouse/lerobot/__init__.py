"""LeRobot datasets as blobhouse tables: :func:`ingest_lerobot` imports one (its v3 layout:
meta/ JSON and Parquet, data/ Parquet, videos/ MP4) with each video file stored once;
:class:`~blobhouse.lerobot.source.LeRobotSource` reads and checks one;
:func:`~blobhouse.lerobot.sample.write_sample_dataset` writes a synthetic one. Frames come back
decoded through the loaders' ``frames=`` option (:mod:`blobhouse.read.video`).
"""

from blobhouse.lerobot.ingest import LeRobotImport, ingest_lerobot
from blobhouse.lerobot.source import LeRobotSource, column_name

__all__ = ["LeRobotImport", "LeRobotSource", "column_name", "ingest_lerobot"]

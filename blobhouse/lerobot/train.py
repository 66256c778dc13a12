"""``lerobot-train`` on a blobhouse table: LeRobot's own training command, whose dataset is
built inside LeRobot (``lerobot.datasets.factory.make_dataset``), with
:class:`~blobhouse.lerobot.LeRobotDataset` and its metadata class in place of LeRobot's.

    python -m blobhouse.lerobot.train --dataset.repo_id=me/robot --dataset.root=TABLE \\
        --policy.type=act ...

Every argument is ``lerobot-train``'s; ``--dataset.root`` names the table (a path or an
object-store URI). LeRobot must be installed beside blobhouse (``pip install lerobot``).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from blobhouse.errors import MissingExtraError


def main(argv: Sequence[str] | None = None) -> None:
    """Run ``lerobot-train`` with ``argv`` (default: this process's arguments), its dataset
    read from a blobhouse table."""
    try:
        from lerobot.datasets import factory
        from lerobot.scripts import lerobot_train
    except ImportError as error:
        raise MissingExtraError(
            f"python -m blobhouse.lerobot.train runs LeRobot's lerobot-train, and LeRobot is not "
            f"installed here ({error}): pip install lerobot"
        ) from error
    from blobhouse.lerobot.dataset import LeRobotDataset
    from blobhouse.lerobot.info import LeRobotDatasetMetadata

    # make_dataset looks both names up in its module when it runs: the one place to swap them
    factory.LeRobotDataset = LeRobotDataset
    factory.LeRobotDatasetMetadata = LeRobotDatasetMetadata
    if argv is not None:
        sys.argv = [sys.argv[0], *argv]
    lerobot_train.main()


if __name__ == "__main__":
    main()

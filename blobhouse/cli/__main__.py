"""``python -m blobhouse.cli``: the ``blobhouse`` command."""

import sys

from blobhouse.cli import main

if __name__ == "__main__":
    sys.exit(main())

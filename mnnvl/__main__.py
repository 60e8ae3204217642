"""``python -m mnnvl``: the same CLI as the ``mnnvl`` command."""

import sys

from mnnvl.cli.main import main

if __name__ == "__main__":
    sys.exit(main())

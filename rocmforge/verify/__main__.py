"""``python -m rocmforge.verify``: the same as ``python -m rocmforge verify``."""

import sys

from rocmforge.cli import main

sys.exit(main(["verify", *sys.argv[1:]]))

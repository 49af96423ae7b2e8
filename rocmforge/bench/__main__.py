"""``python -m rocmforge.bench``: the same as ``python -m rocmforge bench``."""

import sys

from rocmforge.cli import main

sys.exit(main(["bench", *sys.argv[1:]]))

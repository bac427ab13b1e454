"""`python -m phalanx.bench`: the same as `phalanx bench`."""

from __future__ import annotations

import sys

from phalanx.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", *sys.argv[1:]]))

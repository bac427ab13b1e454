"""`python -m phalanx.devcluster.agent ...`: run the node agent in the foreground until SIGTERM/SIGINT."""

import sys

from phalanx.devcluster.agent.agent import main

if __name__ == "__main__":
    sys.exit(main())

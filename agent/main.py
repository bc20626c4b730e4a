"""``python -m agent.main``: the same entry point as ``pallas-agent`` (agent/app.py)."""

import sys

from agent.app import main

if __name__ == "__main__":
    sys.exit(main())

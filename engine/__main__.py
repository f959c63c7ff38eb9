"""``python -m engine serve MODEL ...``: the engine's OpenAI-compatible server (see engine/server/cli.py)."""

import sys

from engine.server.cli import main

if __name__ == "__main__":
    sys.exit(main())

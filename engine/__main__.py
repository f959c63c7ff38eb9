"""``python -m engine serve MODEL ...``: the engine's OpenAI-compatible server; ``python -m engine worker MODEL
...``: another node's tensor-parallel ranks (see engine/server/cli.py)."""

import sys

from engine.server.cli import main

if __name__ == "__main__":
    sys.exit(main())

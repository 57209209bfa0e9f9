"""Where the ``kv-compress`` binary is: a leaf every room that runs the codec asks."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

CLI_NAME = "kv-compress"
BUILD_HINT = "build it with `make build-compress` (or `make setup`), or set KV_COMPRESS_PATH"
_REPO_ROOT = Path(__file__).resolve().parents[2]


def find_cli_binary() -> str:
    """Locate kv-compress: $KV_COMPRESS_PATH, the repo's bin/, ./bin/, then PATH."""
    env = os.environ.get("KV_COMPRESS_PATH")
    if env:
        if Path(env).is_file() and os.access(env, os.X_OK):
            return env
        raise FileNotFoundError(f"KV_COMPRESS_PATH={env} is not an executable file; {BUILD_HINT}")
    for candidate in (_REPO_ROOT / "bin" / CLI_NAME, Path.cwd() / "bin" / CLI_NAME):
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    found = shutil.which(CLI_NAME)
    if found:
        return found
    raise FileNotFoundError(f"Go CLI {CLI_NAME} not found; {BUILD_HINT}")


def check_cli_available() -> bool:
    """True when kv-compress is found and executable."""
    try:
        find_cli_binary()
    except FileNotFoundError:
        return False
    return True

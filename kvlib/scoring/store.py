"""The results store: one small JSON file per finished unit of work, named by a content key
(the sha256 of everything the unit's numbers depend on), so a killed run loses nothing it
finished, a rerun computes only what is missing, and two runs can share one directory.

A file holds its key and the identity the key was made from; one that does not parse, or
whose identity does not hash to its name, is not trusted: the unit is recomputed, with a
warning. Writes go to a unique temp file in the same directory and are renamed into place,
so a reader sees a whole file or none, and concurrent writers of one key (whose content is
the same but for timings) cannot corrupt it.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvlib.env import flag, kvlib_home


class StoreError(ValueError):
    """The results directory cannot be used (one line naming it)."""


def unit_key(identity: dict[str, Any]) -> str:
    """The content key of a unit: sha256 of its identity as canonical JSON."""
    return hashlib.sha256(json.dumps(identity, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def default_dir() -> Path:
    """``$KVLIB_RESULTS``, else ``$KVLIB_HOME/results`` (``~/.cache/kvlib/results``)."""
    return Path(os.environ.get("KVLIB_RESULTS") or kvlib_home() / "results")


@dataclass(frozen=True)
class ResultsStore:
    """A directory of unit files; ``fresh`` ignores what is there (and overwrites it)."""

    root: Path
    fresh: bool = False

    @classmethod
    def open(cls, root: str | os.PathLike | None = None, fresh: bool = False) -> "ResultsStore":
        """The store at ``root`` (default ``default_dir()``), created if needed; StoreError when it
        cannot be written, before anything slow starts. ``KVLIB_FRESH=1`` also means ``fresh``."""
        path = Path(root) if root else default_dir()
        fresh = fresh or flag("KVLIB_FRESH")
        try:
            path.mkdir(parents=True, exist_ok=True)
            fd, probe = tempfile.mkstemp(prefix=".probe-", dir=path)
            os.close(fd)
            os.unlink(probe)
        except OSError as e:
            raise StoreError(f"results directory {path}: not writable ({e.strerror or e})") from None
        return cls(path, fresh)

    def path(self, key: str) -> Path:
        return self.root / key[:2] / f"{key}.json"

    def get(self, key: str) -> dict[str, Any] | None:
        """The unit stored under ``key``, or None (missing, ``fresh``, or not trusted: warned)."""
        if self.fresh:
            return None
        p = self.path(key)
        try:
            text = p.read_text()
        except FileNotFoundError:
            return None
        except OSError as e:
            return self._distrust(p, f"unreadable ({e.strerror})")
        try:
            unit = json.loads(text)
        except ValueError:
            return self._distrust(p, "not valid JSON (truncated?)")
        if not isinstance(unit, dict) or not isinstance(unit.get("identity"), dict):
            return self._distrust(p, "no identity")
        if unit.get("key") != key or unit_key(unit["identity"]) != key:
            return self._distrust(p, "its content does not hash to its name")
        return unit

    def put(self, identity: dict[str, Any], body: dict[str, Any]) -> str:
        """Store ``body`` under the key of ``identity``, atomically; returns the key."""
        key = unit_key(identity)
        p = self.path(key)
        p.parent.mkdir(exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{key[:12]}-", suffix=".tmp", dir=p.parent)
        try:
            with os.fdopen(fd, "w") as f:
                json.dump({"key": key, "identity": identity, **body}, f)
            os.replace(tmp, p)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
        return key

    def __len__(self) -> int:
        return sum(1 for _ in self.root.glob("??/*.json"))

    @staticmethod
    def _distrust(p: Path, why: str) -> None:
        print(f"kvlib: warning: {p}: {why}; recomputing that unit", file=sys.stderr, flush=True)
        return None

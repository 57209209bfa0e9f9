"""Lazy re-exports for a package's ``__init__`` (PEP 562): a name is imported from its module on
first use, so importing a package runs none of its modules and adds no import edge."""

from __future__ import annotations

import importlib
from typing import Any, Callable


def lazy_exports(package: str, table: dict[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for ``package``: ``table`` maps a public name to the module
    (relative to ``package``) that defines it."""
    def getattr_(name: str) -> Any:
        if name not in table:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(f"{package}.{table[name]}"), name)

    def dir_() -> list[str]:
        return sorted(table)

    return getattr_, dir_


def table_of(**modules: str) -> dict[str, str]:
    """{name: module} from ``module="name name ..."`` keyword arguments."""
    return {name: module for module, names in modules.items() for name in names.split()}

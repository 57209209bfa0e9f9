"""The report room: tables and figures the notebooks display, from results or their JSON."""

from kvlib._lazy import lazy_exports, table_of

_EXPORTS = table_of(common="Figure fmt setup_notebook timing_table")
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(_EXPORTS)

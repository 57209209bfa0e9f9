"""The budget room: per-slot sensitivity, the exact allocation under a bit budget, and the mixes it plans."""

from kvlib._lazy import lazy_exports, table_of

_EXPORTS = table_of(sensitivity="CalibrationConfig Sensitivity", pricing="measure_sensitivity", allocate="Allocation allocate", plan="parse_budgets plan_mixes")
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(_EXPORTS)

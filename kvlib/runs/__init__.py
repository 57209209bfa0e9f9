"""The runs room: a validation, a sweep and the cross-model comparison, each set up once at the edge."""

from kvlib._lazy import lazy_exports, table_of

_EXPORTS = table_of(setup="RunParams RunSetup prepare_run", validate="ValidationResult run_full_validation run_quick_test", sweep="SweepResult SchemeResult run_sweep", crossmodel="CrossModelResult run_models")
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(_EXPORTS)

"""The scoring room: windows and perplexity, units and their results store, provenance, executors and statistics."""

from kvlib._lazy import lazy_exports, table_of

_EXPORTS = table_of(perplexity="Window plan_windows compute_perplexity score_windows evaluate_windows PerplexityResult WindowResult", store="ResultsStore unit_key", provenance="RunIdentity identify code_identity", executor="SerialExecutor RayExecutor ScoringJob", stats="bootstrap_delta_ci KLDSummary")
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(_EXPORTS)

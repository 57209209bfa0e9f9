"""kvlib: does a KV-cache compression keep the model's quality?

Import what you use from ``kvlib`` itself (``from kvlib import run_sweep``); the rooms below
(``kvlib.cache``, ``kvlib.codec``, ``kvlib.transforms``, ``kvlib.models``, ``kvlib.scoring``,
``kvlib.checks``, ``kvlib.budget``, ``kvlib.runs``, ``kvlib.report``) are where the code lives,
in the order the data flows. Names load on first use, so ``import kvlib`` is instant.
"""

from kvlib._hqq_deferred import install as _defer_hqq
from kvlib._lazy import lazy_exports, table_of

_defer_hqq()  # transformers' cache module imports hqq only when the HQQ peer needs it (kvlib._hqq_deferred)

# The design documents' API, then the sweep's and the room's entry points: name -> module.
_EXPORTS = table_of(**{
    "cache.io": "KVCacheMetadata extract_kv_cache save_kv_cache load_kv_cache validate_kv_cache_shape "
                "compute_kv_cache_stats expected_geometry",
    "cache.layout": "cache_layers make_cache new_cache",
    "codec.spec": "CodecConfig Scheme SchemeError resolve_codec presets",
    "codec.cli": "compress_kv_cache decompress_kv_cache roundtrip_kv_cache get_compression_metrics",
    "codec.metrics": "CompressionMetrics print_metrics_report",
    "transforms.base": "CacheTransform CodecRoundtrip register_peer",
    "transforms.codec": "cache_transforms",
    "models.sources": "load_model_and_tokenizer resolve_model register_source Source",
    "models.zoo": "list_models",
    "models.corpus": "load_corpus",
    "scoring.perplexity": "compute_perplexity plan_windows PerplexityResult",
    "scoring.store": "ResultsStore",
    "checks.decoding": "DecodingChecks",
    "checks.retrieval": "RetrievalConfig",
    "checks.agreement": "AgreementConfig",
    "budget.sensitivity": "CalibrationConfig",
    "runs.setup": "RunParams prepare_run",
    "runs.validate": "ValidationResult run_full_validation run_quick_test synthetic_cache",
    "runs.sweep": "SweepResult SchemeResult run_sweep default_schemes",
    "runs.crossmodel": "CrossModelResult run_models",
})
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(_EXPORTS)

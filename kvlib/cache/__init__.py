"""The cache room: a model's KV cache as tensors, files and layouts (full and sliding-window layers)."""

from kvlib._lazy import lazy_exports, table_of

_EXPORTS = table_of(io="KVCacheMetadata extract_kv_cache save_kv_cache load_kv_cache validate_kv_cache_shape expected_geometry compute_kv_cache_stats metadata_of file_metadata", layout="CacheLayout cache_layers cache_like context_cache layout_of make_cache model_layout new_cache geometry")
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(_EXPORTS)

"""The codec room: the scheme grammar (``CodecConfig``), the ``kv-compress`` binary as a program and as a server, and its metrics."""

from kvlib._lazy import lazy_exports, table_of

_EXPORTS = table_of(spec="CodecConfig Scheme LayerScheme HeadScheme SchemeError resolve_codec presets preset_bits codec_gates", binary="find_cli_binary check_cli_available", cli="compress_kv_cache decompress_kv_cache roundtrip_kv_cache get_compression_metrics KVCompressError", metrics="CompressionMetrics pool_metrics pool_tensors quality_level print_metrics_report", server="CodecServer CodecServerError shared_server")
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(_EXPORTS)

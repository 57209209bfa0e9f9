"""The transforms room: what a check compares — a cache through kvlib's codec, or a peer's cache."""

from kvlib._lazy import lazy_exports, table_of

_EXPORTS = table_of(base="CacheTransform CodecRoundtrip register_peer peer_transforms peers_unavailable select_peers default_peers checked_peers", codec="cache_transforms CLICacheRoundtrip ServerCacheRoundtrip ContextFile", peer="QuantoPeer QuantizedCachePeer", hqq_peer="HqqPeer hqq_unavailable")
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(_EXPORTS)

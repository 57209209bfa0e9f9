"""What a check compares: a cache transform, ``transform(cache) -> (cache, CompressionMetrics)``.

A transform is a class with a ``kind`` (the family results and reports group by), a ``name`` (as
results show it), a canonical ``spec`` and a ``key`` (what a results-store unit is keyed by), as
kvpress's presses are: ``CacheTransform`` → ``CodecRoundtrip`` (kv-compress, by file or server)
→ ...; peers (other libraries' caches run beside kvlib's codec) register a factory here by name.
"""

from __future__ import annotations

from typing import Any, Callable, ClassVar

from kvlib.codec.spec import CodecConfig


class CacheTransform:
    """One way a context cache comes back to the model: ``(cache) -> (cache, metrics)``."""

    kind: ClassVar[str] = ""
    name: str = ""

    @property
    def spec(self) -> str:
        """What it computes, as results show it."""
        raise NotImplementedError

    @property
    def key(self) -> str:
        """What it computes, as a results-store unit's key names it (versions included)."""
        return self.spec

    def __call__(self, cache: Any) -> tuple[Any, Any]:
        raise NotImplementedError

    def roundtrip_layer(self, layer: int, key: Any, value: Any) -> tuple[Any, Any, Any]:
        """Write mode: one layer's K and V as written, through the transform, as
        (key, value, metrics); the tensors keep their shape, dtype and device."""
        raise NotImplementedError(f"{type(self).__name__} has no write mode")

    converts_queries: ClassVar[bool] = False  # write mode: whether query_layer changes Q

    def query_layer(self, layer: int, query: Any) -> Any:
        """Write mode: Q as the engine's attention reads it (exact unless the format converts it)."""
        return query


class CodecRoundtrip(CacheTransform):
    """A round trip through kvlib's codec under ``self.codec`` (subclasses say how it is reached)."""

    kind: ClassVar[str] = "kvq"
    codec: CodecConfig

    @property
    def name(self) -> str:  # type: ignore[override]
        return self.codec.name

    @property
    def spec(self) -> str:
        return self.codec.spec


def unit_key_of(transform: Any) -> str | None:
    """A transform's store key, or None for a plain function (its results are never stored)."""
    return transform.key if isinstance(transform, CacheTransform) else None


# Peers: family name -> (factory of its transforms, why it cannot run here or None).
_PEERS: dict[str, tuple[Callable[[], list[CacheTransform]], Callable[[], str | None]]] = {}


def register_peer(family: str, unavailable: Callable[[], str | None]) -> Callable:
    """Register a peer family's factory (a decorator): ``unavailable()`` says why it cannot run."""
    def wrap(factory: Callable[[], list[CacheTransform]]) -> Callable[[], list[CacheTransform]]:
        if family in _PEERS:
            raise ValueError(f"peer family {family!r} registered twice")
        _PEERS[family] = (factory, unavailable)
        return factory
    return wrap


def peer_transforms() -> list[CacheTransform]:
    """Every registered peer's transforms (cheap to make: nothing heavy is imported until called)."""
    return [t for factory, _ in _PEERS.values() for t in factory()]


def peers_unavailable() -> str | None:
    """Why the peers cannot run here (the first reason), or None when they can."""
    return next((why for _, unavailable in _PEERS.values() if (why := unavailable()) is not None), None)

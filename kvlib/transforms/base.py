"""What a check compares: a cache transform, ``transform(cache) -> (cache, CompressionMetrics)``.

A transform is a class with a ``kind`` (the family results and reports group by), a ``name`` (as
results show it), a canonical ``spec`` and a ``key`` (what a results-store unit is keyed by), as
kvpress's presses are: ``CacheTransform`` → ``CodecRoundtrip`` (kv-compress, by file or server)
→ ...; peers (other libraries' caches run beside kvlib's codec) register a factory here by name.
"""

from __future__ import annotations

from typing import Any, Callable, ClassVar, Sequence, Union

from kvlib.cache.layout import CacheLayout
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


# Peers: family name -> (factory of its transforms, why it cannot run here or None), in registration order.
_PEERS: dict[str, tuple[Callable[[], list[CacheTransform]], Callable[[], str | None]]] = {}
_OPT_IN: set[str] = set()  # families a selection of True leaves out (slow ones): asked for by name

# Which peers run: True (the default families), False/None/"" (none), or names, comma-separated or a
# sequence: a family ("hf-hqq": all its rows) or one row of it ("hf-hqq-int4").
PeerSelection = Union[bool, None, str, Sequence[str]]


def register_peer(family: str, unavailable: Callable[[], str | None], opt_in: bool = False) -> Callable:
    """Register a peer family's factory (a decorator): ``unavailable()`` says why it cannot run;
    an ``opt_in`` family runs only when a selection names it, never under True."""
    def wrap(factory: Callable[[], list[CacheTransform]]) -> Callable[[], list[CacheTransform]]:
        if family in _PEERS:
            raise ValueError(f"peer family {family!r} registered twice")
        _PEERS[family] = (factory, unavailable)
        if opt_in:
            _OPT_IN.add(family)
        return factory
    return wrap


def default_peers() -> list[str]:
    """The families a selection of True runs (every registered one but the opt-in ones)."""
    return [f for f in _PEERS if f not in _OPT_IN]


def _selected(peers: PeerSelection) -> list[tuple[str, CacheTransform]]:
    """(family, transform) for each transform ``peers`` selects, in registration order; a name
    that is neither a family nor one of its rows is a ValueError naming the choices."""
    if peers is True:
        names = default_peers()
    elif not peers:
        return []
    else:
        names = [n.strip() for n in (peers.split(",") if isinstance(peers, str) else peers) if n.strip()]
    made = {family: factory() for family, (factory, _) in _PEERS.items()}
    rows = {t.name: family for family, ts in made.items() for t in ts}
    bad = [n for n in names if n not in made and n not in rows]
    if bad:
        raise ValueError(f"unknown peer {', '.join(map(repr, bad))}: choose families ({', '.join(made)}) "
                         f"or rows ({', '.join(rows)})")
    return [(family, t) for family, ts in made.items() for t in ts if family in names or t.name in names]


def peer_transforms(peers: PeerSelection = True) -> list[CacheTransform]:
    """The selected peers' transforms (cheap to make: nothing heavy is imported until called)."""
    return [t for _, t in _selected(peers)]


def peers_unavailable(peers: PeerSelection = True) -> str | None:
    """Why the selected peers cannot run here (the first reason), or None when they can."""
    families = dict.fromkeys(family for family, _ in _selected(peers))
    return next((why for family in families if (why := _PEERS[family][1]()) is not None), None)


def run_shapes(geometry: dict[str, Any], windows: Sequence[Any], mode: str) -> list[tuple[int, str, tuple[int, ...]]]:
    """(layer, role, shape) of each distinct K and V a transform gets in a run (see select_peers)."""
    heads, dim, layers = int(geometry["num_kv_heads"]), int(geometry["head_dim"]), tuple(geometry["layer_windows"])
    if mode == "write":
        stored = {(i, w.length) for w in windows for i in range(len(layers))}
    else:
        stored = {(i, CacheLayout(layers, w.context_tokens).stored(i))
                  for w in windows if w.context_tokens > 0 for i in range(len(layers))}
    return [(i, role, (1, heads, n, dim)) for i, n in sorted(stored) for role in ("key", "value")]


def select_peers(peers: PeerSelection, geometry: dict[str, Any], windows: Sequence[Any], mode: str = "prefix",
                 ) -> tuple[PeerSelection, list[tuple[CacheTransform, str]]]:
    """Before any window: the selection without the peers that cannot run here (their family's
    ``unavailable()``) or cannot take this run's caches (a transform's ``refuses(shapes)``: the
    (layer, role, shape) of every K and V it would get, from the model's ``geometry``
    (kvlib.cache.layout.geometry) and the ``windows`` (kvlib.scoring.perplexity.Window): in
    prefix mode each window's context as each layer stores it, in write mode the window's K/V).
    Returns that selection (``peers`` itself when nothing is refused) and (transform, why) for
    each one refused: a row that says so, never a crash mid-sweep or another computation."""
    chosen = _selected(peers)
    why_family = {family: _PEERS[family][1]() for family in dict.fromkeys(f for f, _ in chosen)}
    shapes: list[tuple[int, str, tuple[int, ...]]] | None = None  # made when a transform asks
    refused: list[tuple[CacheTransform, str]] = []
    for family, t in chosen:
        why, refuses = why_family[family], getattr(t, "refuses", None)
        if why is None and refuses is not None:
            shapes = run_shapes(geometry, windows, mode) if shapes is None else shapes
            why = refuses(shapes)
        if why:
            refused.append((t, why))
    if not refused:
        return peers, []
    out = {t.name for t, _ in refused}
    return tuple(t.name for _, t in chosen if t.name not in out), refused


def checked_peers(peers: PeerSelection) -> PeerSelection:
    """The part of a selection the decoding checks run: its default families' rows (an opt-in peer
    is scored on perplexity alone; its cost and the shapes it refuses would be met again on every
    haystack and prompt)."""
    if peers is True or not peers:
        return peers
    return tuple(t.name for family, t in _selected(peers) if family not in _OPT_IN)

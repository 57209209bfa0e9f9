"""Where the model is sensitive: the cost of compressing each (layer, role) slot on its own.

On calibration windows that never overlap the evaluated ones, each window's context cache goes
through every candidate codec once. Then, for each slot and candidate, the window's suffix runs
against the exact cache with only that slot replaced by the candidate's reconstruction, and the
mean KL(exact || that) over the suffix's targets is the slot's cost under the candidate. The
decoder layers before the slot see exactly the exact run's inputs, so their outputs are replayed
from it instead of computed again (prefix reuse: the same bits, about half the layers' work).
The pass itself, and its cheaper measure, are in ``kvlib.budget.pricing``.

Per-tensor compression is independent, so a mix of candidates per slot reconstructs exactly what
the per-layer spec of that mix does in ``kv-compress``; ``measure_mix`` scores such a mix on the
same windows, to check that the slots' costs add up.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any, Iterator

import torch
import torch.nn.functional as F

from kvlib.cache.layout import cache_layers
from kvlib.codec.spec import CodecConfig, resolve_codec
from kvlib.cache.layout import layout_of, make_cache, new_cache

ROLES = ("key", "value")
# The candidates a slot may take span what works on the zoo: at 2.25, 3.25 and 4.25 bits both a
# Hadamard-rotated per-token code and KIVI's axis (keys per channel, groups of 128 tokens; values
# per token, unrotated), then 6.25 and 8.5 bits. Rotated per-token keys fail on Gemma-3 and Qwen2.5
# where per-channel keys pass (docs/mixed-precision.md); SmolLM2 prefers the rotated ones. At 3 and
# 4 bits the rotated codes are symmetric, not Lloyd-Max: Lloyd-Max's centroids shrink a
# reconstruction (its projection on the original is 0.973 of it at 3 bits, rot3's 0.989), which
# softens attention; its KL is lower but its perplexity delta higher.
DEFAULT_CANDIDATES = ("lm2rot", "k=asym2/g128/channel,v=asym2/g128", "rot3", "k=asym3/g128/channel,v=asym3/g128",
                      "rot4", "k=asym4/g128/channel,v=asym4/g128", "sym6/g64/rot", "q8_0")
# How a slot's cost is measured: "full" runs one forward per (slot, candidate) over the whole
# vocabulary; "fast" runs one batched forward per layer (every candidate of its keys and values at
# once) and prices the LM head on the exact run's top tokens only (kvlib.budget.batched).
MEASURES = ("fast", "full")
_FIELDS = ("corpus", "windows", "targets", "candidates", "measure", "heads")


@dataclass(frozen=True)
class CalibrationConfig:
    """Which windows the sensitivity pass scores, and the candidates it prices.

    ``corpus``: "auto" takes the embedded corpus when another one is evaluated, else the
    evaluated corpus's tokens after its last evaluated window. ``windows`` windows of the
    model's window length each score their last ``targets`` tokens."""

    corpus: str = "auto"
    windows: int = 2
    targets: int = 128
    candidates: tuple[str, ...] = DEFAULT_CANDIDATES
    measure: str = "fast"
    heads: bool = False  # also price each KV head alone, and allot a candidate per head (kvlib.budget.allocate)

    def to_string(self) -> str:
        return (f"corpus={self.corpus};windows={self.windows};targets={self.targets};"
                f"candidates={'|'.join(self.candidates)};measure={self.measure}" + (";heads=on" if self.heads else ""))

    @classmethod
    def from_string(cls, s: str) -> "CalibrationConfig":
        """Parse ``to_string``'s form; any field may be left out."""
        kw: dict[str, Any] = {}
        for part in filter(None, (p.strip() for p in s.split(";"))):
            k, sep, v = part.partition("=")
            if not sep or k not in _FIELDS:
                raise ValueError(f"calibration setting {part!r}: want corpus=, windows=, targets=, candidates=, measure= "
                                 f"or heads=")
            if k in ("windows", "targets"):
                try:
                    kw[k] = int(v)
                except ValueError:
                    raise ValueError(f"calibration setting {part!r}: not an integer") from None
            elif k == "heads":
                if v not in ("on", "off"):
                    raise ValueError(f"calibration setting {part!r}: heads=on or heads=off")
                kw[k] = v == "on"
            else:
                kw[k] = split_candidates(v) if k == "candidates" else v
        c = cls(**kw)
        c.check()
        return c

    def check(self) -> None:
        if self.windows < 1 or self.targets < 1 or not self.candidates:
            raise ValueError(f"calibration needs windows >= 1, targets >= 1 and a candidate: {self.to_string()}")
        if self.measure not in MEASURES:
            raise ValueError(f"calibration measure {self.measure!r}: choose one of {', '.join(MEASURES)}")
        engines = [c for c in self.candidates if ":" in c]  # an engine's format is engine:format
        if self.heads and engines:
            raise ValueError(f"calibration heads=on allots a scheme per KV head, which an engine's format cannot be "
                             f"({engines[0]} stores every head of a layer alike): leave out {', '.join(engines)}")


def split_candidates(text: str) -> tuple[str, ...]:
    """Candidates separated by '|' (a spec may hold commas: k=...,v=...); preset names alone may
    be separated by commas (lm2rot,rot3)."""
    sep = "|" if "|" in text or "=" in text else ","
    return tuple(x.strip() for x in text.split(sep) if x.strip())


@dataclass
class Sensitivity:
    """The slots' costs: ``kl[layer][role][candidate]`` (mean nats per target over the
    calibration windows) and the bytes each slot stores under each candidate (summed over
    the windows' context caches), with the elements it holds."""

    candidates: list[str]  # canonical specs, in the order of the last axis
    names: list[str]  # their display names
    kl: list[list[list[float]]]
    stored_bytes: list[list[list[int]]]
    elements: list[list[int]]
    calibration: str  # the corpus and the windows' token ranges, for the report
    targets: int  # scored tokens over all windows
    seconds: float = 0.0
    forwards: int = 0  # suffix forwards run
    layers_run: float = 0.0  # share of the decoder layers computed (prefix reuse skips the rest)
    measure: str = "full"  # how the costs were measured (MEASURES)
    context_tokens: int = 0  # tokens each calibration context held: the evaluated windows' layout
    head_tokens: int = 0  # tokens of the vocabulary the LM head scored per target (the fast measure's top tokens)
    head_tail: float = 0.0  # the exact probability outside them, mean over targets
    # head_kl[layer][role][head][candidate]: the cost of one KV head of the slot alone (empty unless asked)
    head_kl: list[list[list[list[float]]]] = field(default_factory=list)

    @property
    def num_layers(self) -> int:
        return len(self.kl)

    def bits(self, layer: int, role: int, candidate: int) -> float:
        """Bits per element the slot stores under the candidate."""
        return 8 * self.stored_bytes[layer][role][candidate] / max(self.elements[layer][role], 1)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Sensitivity":
        return cls(**d)


@dataclass
class CalibrationWindow:
    """One calibration window's exact run: the context cache, the suffix and its exact scores."""

    begin: int
    end: int
    context: Any  # the context's cache (a DynamicCache in the model's layout)
    suffix: torch.Tensor  # [1, targets + 1]: the tokens after the context; all but the first are scored
    logp: torch.Tensor  # [targets, vocab] exact log-probabilities
    p: torch.Tensor | None = None  # their exp, computed once for every variant's KL
    layer_outputs: list[Any] = field(default_factory=list)  # each decoder layer's output on the suffix
    lse: torch.Tensor | None = None  # [targets] the exact logits' log-sum-exp (the fast measure's anchor)


def decoder_layers(model: Any, num_layers: int) -> Any:
    """The model's decoder layers (one per cache layer), or None when they cannot be found."""
    try:
        dec = model.get_decoder()
    except (AttributeError, NotImplementedError, ValueError):
        return None
    layers = getattr(dec, "layers", None)
    return layers if isinstance(layers, torch.nn.ModuleList) and len(layers) == num_layers else None


@contextmanager
def _recording(layers: Any, outputs: list[Any]) -> Iterator[None]:
    """Record each decoder layer's output."""
    hooks = [m.register_forward_hook(lambda _m, _a, out, i=i: outputs.__setitem__(i, out)) for i, m in enumerate(layers)]
    try:
        yield
    finally:
        for h in hooks:
            h.remove()


def _batched(out: Any, batch: int) -> Any:
    """A recorded layer output (a tensor, or a tuple led by one) repeated over ``batch`` rows (a view)."""
    if batch == 1:
        return out
    if isinstance(out, tuple):
        return (out[0].expand(batch, *out[0].shape[1:]),) + out[1:]
    return out.expand(batch, *out.shape[1:])


@contextmanager
def _replaying(layers: Any, outputs: list[Any], upto: int, batch: int = 1) -> Iterator[None]:
    """Layers before ``upto`` return their recorded outputs (repeated over ``batch`` rows) instead
    of computing them (a forward already set on the instance, as accelerate's hooks set one, is
    put back after)."""
    own = [layers[i].__dict__.get("forward") for i in range(upto)]
    for i in range(upto):
        layers[i].forward = lambda *a, _out=_batched(outputs[i], batch), **k: _out
    try:
        yield
    finally:
        for i in range(upto):
            if own[i] is None:
                del layers[i].forward
            else:
                layers[i].forward = own[i]


def calibration_window(model: Any, ids: torch.Tensor, begin: int, length: int, targets: int,
                       context: int | None = None) -> CalibrationWindow:
    """Run one window exactly: its first ``context`` tokens' cache (default: all but the last
    ``targets`` + 1 of ``length``; the evaluated windows' context length, so that the cache has
    their layout), then the suffix (that context's last token and ``targets`` more) against it,
    recording the suffix's log-probabilities and each decoder layer's output."""
    n = length - targets - 1 if context is None else context
    if not 0 < n <= length - targets - 1:
        raise ValueError(f"calibration window: a context of {n} tokens and {targets} targets do not fit {length} tokens")
    device = next(model.parameters()).device
    window = ids[:, begin: begin + n + targets + 1].to(device)
    ctx = model(input_ids=window[:, :n], past_key_values=new_cache(model), use_cache=True).past_key_values
    w = CalibrationWindow(begin, begin + n + targets + 1, ctx, window[:, n:], torch.empty(0))
    layers = decoder_layers(model, len(ctx.layers))
    w.layer_outputs = [None] * (len(layers) if layers is not None else 0)
    with _recording(layers if layers is not None else [], w.layer_outputs):
        logits = _suffix_logits(model, w, cache_layers(ctx))
    w.lse = torch.logsumexp(logits, dim=-1)
    w.logp = F.log_softmax(logits, dim=-1)  # as every variant's, so nothing compressed scores exactly 0
    w.p = w.logp.exp()
    return w


def _suffix_logits(model: Any, w: CalibrationWindow, layers: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
    cache = make_cache(list(layers), layout_of(w.context))
    out = model(input_ids=w.suffix, past_key_values=cache, use_cache=True)
    return out.logits[0, :-1].float()


def _suffix_logp(model: Any, w: CalibrationWindow, layers: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
    return F.log_softmax(_suffix_logits(model, w, layers), dim=-1)


def mean_kl(logp_exact: torch.Tensor, logp: torch.Tensor, p_exact: torch.Tensor | None = None) -> float:
    """Mean over targets of KL(exact || other), nats (>= 0 per target up to rounding);
    ``p_exact`` is logp_exact.exp() when the caller has it."""
    p = logp_exact.exp() if p_exact is None else p_exact
    return float((p * (logp_exact - logp)).sum(-1).clamp_min(0).double().mean())


def score_variant(model: Any, w: CalibrationWindow, layers: list[tuple[torch.Tensor, torch.Tensor]],
                  first_changed: int = 0) -> float:
    """Mean KL of the suffix against ``layers`` (the exact ones but from ``first_changed`` on),
    replaying the recorded outputs of the decoder layers before ``first_changed``."""
    dec = decoder_layers(model, len(layers)) if first_changed > 0 and w.layer_outputs else None
    if dec is None:
        return mean_kl(w.logp, _suffix_logp(model, w, layers), w.p)
    with _replaying(dec, w.layer_outputs, first_changed):
        return mean_kl(w.logp, _suffix_logp(model, w, layers), w.p)


def reconstructions(w: CalibrationWindow, transforms: dict[str, Any]) -> dict[str, tuple[list, dict[str, int]]]:
    """Each candidate's reconstruction of the window's context (own copies: a transform may reuse
    its buffers) and the bytes it stores per tensor."""
    out = {}
    for name, t in transforms.items():
        cache, metrics = t(w.context)
        layers = [(k.clone(), v.clone()) for k, v in cache_layers(cache)]
        out[name] = (layers, {d["name"]: int(d["compressed_size_bytes"]) for d in metrics.tensors})
        del cache
    return out


def measure_mix(model: Any, windows: list[CalibrationWindow], mix: CodecConfig, transforms: dict[str, Any]) -> float:
    """The mean KL, over the calibration windows, of the cache compressed with ``mix``."""
    total = 0.0
    for w in windows:
        cache, _ = transforms[mix.name](w.context)
        total += score_variant(model, w, cache_layers(cache)) * w.logp.shape[0]
        del cache
    return total / sum(w.logp.shape[0] for w in windows)


def role_labels(names: list[str], candidates: list[str], role: int) -> list[str]:
    """Each candidate as the role's own scheme (a preset keeps its name): 'asym2/g128/channel' for
    the keys of k=asym2/g128/channel,v=asym2/g128."""
    out = []
    for name, spec in zip(names, candidates):
        c = resolve_codec(spec)
        out.append(name if "=" not in name else (c.key if role == 0 else c.value).spec)
    return out


def resolve_candidates(names: tuple[str, ...]) -> list[CodecConfig]:
    """The candidates as codecs; each must be one scheme per role, without overrides. An entropy
    stage (+wire, +lossless) is the whole mix's, so all carry the same one or none: then a slot's
    bytes are what that stage stores for it (its tables included), the budget one of bytes sent."""
    out = [resolve_codec(n) for n in names]
    for c in out:
        if c.layers or c.heads:
            raise ValueError(f"candidate {c.name}: a candidate is one scheme per role (no per-layer or per-head overrides)")
    if len({c.entropy_suffix for c in out}) > 1:
        raise ValueError("the candidates carry different entropy stages (" + ", ".join(c.name for c in out)
                         + "): give all of them the same one, or none")
    if len({c.spec for c in out}) != len(out):
        raise ValueError("a candidate is listed twice: " + ", ".join(c.name for c in out))
    return out

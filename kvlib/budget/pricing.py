"""The sensitivity pass: every (layer, role) slot priced under every candidate, by one of two measures.

``full``: one forward of the suffix per (slot, candidate), the whole vocabulary scored: the
definition. ``fast``: one forward per layer, its keys' and values' variants under every candidate
stacked on the batch axis (the layers before it replayed once for all), and the LM head applied to
the exact run's top tokens only. The rest of the vocabulary is one bucket: its log-mass moves by
its p-weighted mean logit shift, which for a linear head is the hidden state's change along the
p-weighted mean of the rest's head rows (exact when every logit shifts alike; to first order
otherwise). Each target's cost is the KL between the exact and the variant's distributions over
(top tokens, the rest): it leaves out how the rest reshuffles within itself. On a 262,144-token
vocabulary the head is most of a forward; ``make sensitivity-check`` compares the two measures'
ranking, allocations and cost.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator

import torch
import torch.nn.functional as F

from kvlib.budget.sensitivity import (ROLES, CalibrationWindow, Sensitivity, _replaying, decoder_layers,
                                      reconstructions, score_variant)
from kvlib.cache.layout import cache_layers, layout_of, make_cache
from kvlib.codec.spec import CodecConfig

TOP_TOKENS = 64  # per target: the exact run's most likely tokens; the fast head scores their union

KV = tuple[torch.Tensor, torch.Tensor]


class FullPricer:
    """One forward per variant over the whole vocabulary (``score_variant``)."""

    name = "full"

    def __init__(self) -> None:
        self.forwards = 0
        self.vocab = 0

    def prepare(self, model: Any, w: CalibrationWindow) -> None:
        self.vocab = int(w.logp.shape[-1])

    def price(self, model: Any, w: CalibrationWindow, exact: list[KV], layer: int, variants: list[KV]) -> list[float]:
        out = []
        for kv in variants:
            layers = list(exact)
            layers[layer] = kv
            out.append(score_variant(model, w, layers, layer))
            self.forwards += 1
        return out


class FastPricer:
    """One batched forward per layer, the LM head on the exact run's top tokens (module docstring)."""

    name = "fast"

    def __init__(self, top: int = TOP_TOKENS) -> None:
        self.top = top
        self.forwards = 0
        self.vocab = 0  # tokens scored per target, the last window's
        self.tail = 0.0  # the exact probability outside them, mean over targets, the last window's

    def prepare(self, model: Any, w: CalibrationWindow) -> None:
        """The window's scored tokens (the union of each target's top ones), their exact
        probabilities, the rest's mass, and the exact run's hidden states and logits through the
        same head (so a variant's change is a difference of like with like)."""
        tokens = torch.unique(w.logp.topk(min(self.top, w.logp.shape[-1]), dim=-1).indices)
        rest = w.p.double()
        self._p = rest[:, tokens].clone()  # [targets, tokens]
        rest[:, tokens] = 0
        self._mass = rest.sum(-1)  # [targets] the exact probability outside the tokens
        self._tokens = tokens
        head = model.get_output_embeddings()
        text = model.config.get_text_config(decoder=True)
        # A linear head (no soft-capping after it): a logit's change is its row times the hidden
        # state's change, and the rest's mean change is the p-weighted mean of its rows times it.
        self._linear = getattr(text, "final_logit_softcapping", None) is None
        self._weight = head.weight[tokens].float()
        self._rows = (rest.float() @ head.weight.float()) if self._linear else None  # [targets, hidden]
        self._hidden, self._z = self._forward(model, w, cache_layers(w.context), 1, 0)
        self.vocab = int(tokens.numel())
        self.tail = float(self._mass.mean())

    def _forward(self, model: Any, w: CalibrationWindow, layers: list[KV], b: int, first: int
                 ) -> tuple[torch.Tensor, torch.Tensor]:
        """The suffix's final hidden states and logits on the tokens, ``b`` caches at once."""
        cache = make_cache(layers, layout_of(w.context))
        dec = decoder_layers(model, len(layers)) if first > 0 and w.layer_outputs else None
        hidden: list[torch.Tensor] = []
        with _head_on(model, self._tokens, hidden), (_replaying(dec, w.layer_outputs, first, b) if dec is not None
                                                     else _nothing()):
            z = model(input_ids=w.suffix.expand(b, -1), past_key_values=cache, use_cache=True).logits[:, :-1]
        return hidden[0][:, :-1].float(), z.float()

    def price(self, model: Any, w: CalibrationWindow, exact: list[KV], layer: int, variants: list[KV]) -> list[float]:
        b = len(variants)
        layers = [(k.expand(b, *k.shape[1:]), v.expand(b, *v.shape[1:])) for k, v in exact]
        layers[layer] = (torch.cat([k for k, _ in variants]), torch.cat([v for _, v in variants]))
        h, z = self._forward(model, w, layers, b, layer)
        self.forwards += 1
        if self._linear:  # differences first: their rounding scales with the change, not the logit
            dh = self._hidden - h  # [b, targets, hidden]
            d = (dh @ self._weight.T).double()  # exact logit minus the variant's, on the tokens
            shift = -(dh * self._rows).sum(-1).double() / self._mass.clamp_min(1e-30)  # the rest's mean logit change
            shift = torch.where(self._mass > 1e-12, shift, torch.zeros_like(shift))
        else:
            d = (self._z - z).double()
            shift = torch.zeros(d.shape[:-1], dtype=torch.float64)
        return [float(x) for x in two_part_kl(self._p, d, self._mass, shift).clamp_min(0).mean(-1)]


def two_part_kl(p: torch.Tensor, d: torch.Tensor, mass: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """KL over (the tokens, the rest) per target, in terms of the changes alone: p the tokens'
    exact probabilities, d their logits' fall (exact minus variant), mass the rest's probability,
    shift its mean logit rise. sum p d - mass shift + log(sum p e^-d + mass e^shift), with
    sum p + mass = 1: as log1p of the small changes (exact where they are tiny); where that
    overflows (a variant that breaks the model), by log-sum-exp, large and finite."""
    base = (p * d).sum(-1) - mass * shift
    near = base + torch.log1p((p * torch.expm1(-d)).sum(-1) + mass * torch.expm1(shift))
    far = base + torch.logsumexp(torch.cat([p.log() - d, (mass.log() + shift).unsqueeze(-1)], -1), -1)
    return torch.where(torch.isfinite(near), near, far)


PRICERS: dict[str, Callable[[], Any]] = {"full": FullPricer, "fast": FastPricer}


@contextmanager
def _nothing() -> Iterator[None]:
    yield


@contextmanager
def _head_on(model: Any, tokens: torch.Tensor, hidden: list[torch.Tensor]) -> Iterator[None]:
    """The model's LM head computes the logits of ``tokens`` only (what follows it in the model,
    as Gemma 2's soft-capping, is element-wise and applies unchanged); its input goes to ``hidden``."""
    head = model.get_output_embeddings()
    if not isinstance(head, torch.nn.Linear):
        raise ValueError(f"the fast sensitivity measure needs a linear LM head, not {type(head).__name__}: "
                         "use --calibration 'measure=full'")
    weight = head.weight[tokens]
    bias = head.bias[tokens] if head.bias is not None else None
    own = head.__dict__.get("forward")
    head.forward = lambda h: (hidden.append(h), F.linear(h, weight, bias))[1]
    try:
        yield
    finally:
        if own is None:
            del head.forward
        else:
            head.forward = own


def _variants(exact: list[KV], recon: dict[str, tuple[list, dict[str, int]]], codecs: list[CodecConfig],
              layer: int) -> list[KV]:
    """The layer's (key, value) with one role replaced by one candidate's reconstruction: keys
    under every candidate, then values under every candidate."""
    k, v = exact[layer]
    return ([(recon[c.name][0][layer][0], v) for c in codecs] + [(k, recon[c.name][0][layer][1]) for c in codecs])


def _head_variants(exact: list[KV], recon: dict[str, tuple[list, dict[str, int]]], codecs: list[CodecConfig],
                   layer: int) -> list[KV]:
    """The layer's (key, value) with one KV head of one role replaced by one candidate's reconstruction
    of it: per role, per head, per candidate."""
    k, v = exact[layer]
    out = []
    for r, x in enumerate((k, v)):
        for h in range(x.shape[1]):
            for c in codecs:
                y = x.clone()
                y[:, h] = recon[c.name][0][layer][r][:, h]
                out.append((y, v) if r == 0 else (k, y))
    return out


def measure_sensitivity(model: Any, windows: list[CalibrationWindow], codecs: list[CodecConfig],
                        transforms: dict[str, Any], calibration: str,
                        progress: Callable[[int, int], None] | None = None, measure: str = "full",
                        heads: bool = False) -> Sensitivity:
    """Every slot's mean KL under every candidate on ``windows``, by ``measure`` (module docstring);
    with ``heads``, also every KV head's alone (``head_kl``: one head of one slot replaced), for an
    allocation per head."""
    t0 = time.perf_counter()
    pricer = PRICERS[measure]()
    nl = len(windows[0].context.layers)
    nc = len(codecs)
    kl = [[[0.0] * nc for _ in ROLES] for _ in range(nl)]
    nbytes = [[[0] * nc for _ in ROLES] for _ in range(nl)]
    elements = [[0, 0] for _ in range(nl)]
    nh = [[int(k.shape[1]), int(v.shape[1])] for k, v in cache_layers(windows[0].context)]  # per layer and role
    heads = heads and max(max(n) for n in nh) > 1  # one KV head a layer: a head's choice is its slot's
    head_kl = [[[[0.0] * nc for _ in range(nh[layer][r])] for r in range(len(ROLES))] for layer in range(nl)] if heads else []
    done, run, total = 0, 0, nl * len(windows)
    for w in windows:
        exact = cache_layers(w.context)
        recon = reconstructions(w, {c.name: transforms[c.name] for c in codecs})
        pricer.prepare(model, w)
        for layer in range(nl):
            costs = pricer.price(model, w, exact, layer, _variants(exact, recon, codecs, layer))
            for r, role in enumerate(ROLES):
                elements[layer][r] += exact[layer][r].numel()
                for c, codec in enumerate(codecs):
                    kl[layer][r][c] += costs[r * nc + c] / len(windows)
                    nbytes[layer][r][c] += recon[codec.name][1][f"layer_{layer}_{role}"]
            if heads:
                costs = iter(pricer.price(model, w, exact, layer, _head_variants(exact, recon, codecs, layer)))
                for r in range(len(ROLES)):  # the variants' order: role, head, candidate
                    for h in range(nh[layer][r]):
                        for c in range(nc):
                            head_kl[layer][r][h][c] += next(costs) / len(windows)
            run += (nl - (layer if w.layer_outputs else 0)) * len(ROLES) * nc
            done += 1
            if progress is not None:
                progress(done, total)
        del recon
    variants = nl * len(ROLES) * nc * len(windows)
    return Sensitivity(candidates=[c.spec for c in codecs], names=[c.name for c in codecs], kl=kl,
                       stored_bytes=nbytes, elements=elements, calibration=calibration,
                       targets=sum(w.logp.shape[0] for w in windows), seconds=time.perf_counter() - t0,
                       forwards=pricer.forwards, layers_run=run / max(variants * nl, 1), measure=measure,
                       context_tokens=layout_of(windows[0].context).seen, head_tokens=pricer.vocab,
                       head_tail=getattr(pricer, "tail", 0.0), head_kl=head_kl)

"""The codec configuration: which scheme the keys and the values go through.

A ``CodecConfig`` is a frozen, hashable value (it can key a sweep) that
round-trips to the spec string ``kv-compress -scheme`` takes. The rules of
the grammar, the presets and every bound live in the Go CLI alone: a spec is
resolved by asking ``kv-compress check``, so Python never re-implements them.
"""

from __future__ import annotations

import json
import re
import subprocess
from dataclasses import asdict, dataclass, field, replace
from functools import lru_cache
from typing import Any

from kvlib.codec.binary import find_cli_binary

DEFAULT_SCHEME = "int4"
LOSSLESS_SUFFIX = "+lossless"
WIRE_SUFFIX = "+wire"  # the wire stage: context rANS on the codes (docs/kv-compress/lossless.md)
ENTROPY_SUFFIXES = (LOSSLESS_SUFFIX, WIRE_SUFFIX)
CLI_TIMEOUT_S = 60


@dataclass(frozen=True)
class Scheme:
    """How one tensor role is quantized (the Go ``Scheme``; see the README's table)."""

    method: str = "sym"  # sym, symf (full range), asym, lm (Lloyd-Max), q4_0, q4_1, q5_0, q5_1, q8_0
    bits: int = 4
    group: int = 64
    axis: str = "token"  # token or channel
    rotate: bool = False  # Walsh-Hadamard along head_dim first
    outliers: float = 0.0  # fraction of largest |x| kept apart as FP16
    residual: int = 0  # last tokens kept exact
    sparsity: float = 0.0  # fraction of smallest |x| zeroed first
    scale: float = 0.0  # an engine format's static per-tensor scale (vllm:fp8_e4m3: 1 unless /scaleS); 0 otherwise

    @property
    def spec(self) -> str:
        """Canonical spelling, identical to the CLI's."""
        if self.method == "none":
            return "none"
        if ":" in self.method:  # an engine's format (engine:format): rotated as the engine does unless /norot
            s = self.method + ("/norot" if self.method.startswith("llama.cpp:") and self.bits < 16 and not self.rotate else "")
            if self.scale not in (0, 1):
                s += f"/scale{format_float32(self.scale)}"
        elif self.method.startswith("q"):
            s = self.method
        else:
            s = f"{self.method}{self.bits}/g{self.group}" + ("/channel" if self.axis == "channel" else "")
        if self.rotate and ":" not in self.method:
            s += "/rot"
        if self.outliers:
            s += f"/out{_num(self.outliers)}"
        if self.residual:
            s += f"/res{self.residual}"
        if self.sparsity:
            s += f"/sp{_num(self.sparsity)}"
        return s


def format_float32(v: float) -> str:
    """Go's strconv.FormatFloat(v, 'g', -1, 32): the shortest digits of the float32, positional for
    exponents -4 to 5."""
    import numpy as np

    f = np.float32(v)
    exp = int(np.format_float_scientific(f, unique=True).split("e")[1])
    if -4 <= exp < 6:
        return np.format_float_positional(f, unique=True, trim="-")
    return np.format_float_scientific(f, unique=True, trim="-")


def _num(v: float) -> str:
    """Go's strconv.FormatFloat(v, 'g', -1, 64) for the fractions used here."""
    r = repr(float(v))
    return r[:-2] if r.endswith(".0") else r


@dataclass(frozen=True)
class LayerScheme:
    """One slot's override: the scheme of a role ("key" or "value") in one layer."""

    layer: int
    role: str
    scheme: Scheme


@dataclass(frozen=True)
class HeadScheme:
    """One KV head's override in a slot (``k3h1=SCHEME``): kv-compress stores that tensor a head at a
    time, this head under ``scheme``, the others under the slot's own."""

    layer: int
    role: str
    head: int
    scheme: Scheme


@dataclass(frozen=True)
class CodecConfig:
    """A scheme per role: keys (``layer_{i}_key``) and values (every other tensor), and per-layer
    overrides (canonical: keys before values, by layer, none equal to its role's default)."""

    key: Scheme = field(default_factory=Scheme)
    value: Scheme = field(default_factory=Scheme)
    lossless: bool = False  # the entropy stage after the quantizer: smaller files, same reconstruction
    layers: tuple[LayerScheme, ...] = ()
    wire: bool = False  # the wire stage instead: context-coded codes, fewer bytes still, same reconstruction
    heads: tuple[HeadScheme, ...] = ()  # head overrides (canonical: keys first, by head then layer)

    @property
    def entropy_suffix(self) -> str:
        """The spec's entropy stage as its suffix ("" for none)."""
        return LOSSLESS_SUFFIX if self.lossless else WIRE_SUFFIX if self.wire else ""

    @property
    def spec(self) -> str:
        """The canonical spec: ``resolve_codec(c.spec) == c``."""
        s = self.key.spec if self.key == self.value else f"k={self.key.spec},v={self.value.spec}"
        return s + _layers_spec(self.layers) + _heads_spec(self.heads) + self.entropy_suffix

    def for_layer(self, layer: int) -> "CodecConfig":
        """The codec of layer ``layer`` alone, its slots' schemes as the defaults and its head overrides
        (write mode sends one layer at a time, which an override of another layer would not name)."""
        if not self.layers and not self.heads:
            return self
        return replace(self, key=self.scheme_for(layer, "key"), value=self.scheme_for(layer, "value"), layers=(),
                       heads=tuple(h for h in self.heads if h.layer == layer))

    def scheme_for(self, layer: int, role: str) -> Scheme:
        """The scheme of ``layer_{layer}_{role}``: its override, else the role's default."""
        for o in self.layers:
            if o.layer == layer and o.role == role:
                return o.scheme
        return self.key if role == "key" else self.value

    @property
    def name(self) -> str:
        """The preset name, or an engine's name for a K and V pairing (exllamav2:q6), when one matches
        (with "+lossless" or "+wire" when an entropy stage is on), else the spec: the CLI's Spec.Name."""
        plain = replace(self, lossless=False, wire=False)
        for name, cfg in (*presets().items(), *engine_pairings().items()):
            if cfg == plain:
                return name + self.entropy_suffix
        return self.spec

    def cli_args(self) -> list[str]:
        return ["-scheme", self.spec]

    def to_dict(self) -> dict[str, Any]:
        return {"spec": self.spec, "name": self.name, "key": asdict(self.key), "value": asdict(self.value),
                "lossless": self.lossless, "wire": self.wire, "layers": [asdict(o) for o in self.layers],
                "heads": [asdict(o) for o in self.heads]}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "CodecConfig":
        """From the CLI's ``check`` output (key_scheme / value_scheme objects, layers)."""
        layers = tuple(LayerScheme(o["layer"], o["role"], Scheme(**o["scheme"])) for o in d.get("layers") or ())
        heads = tuple(HeadScheme(o["layer"], o["role"], o["head"], Scheme(**o["scheme"])) for o in d.get("heads") or ())
        return cls(key=Scheme(**d["key_scheme"]), value=Scheme(**d["value_scheme"]), lossless=bool(d.get("lossless")),
                   layers=layers, wire=bool(d.get("wire")), heads=heads)


def _layers_spec(layers: tuple[LayerScheme, ...]) -> str:
    """The overrides' part of the canonical spec (Go's Spec.layersString): runs of consecutive
    layers of one role and scheme as "k3-5=SCHEME"."""
    out, i = "", 0
    while i < len(layers):
        o, j = layers[i], i + 1
        while (j < len(layers) and layers[j].role == o.role and layers[j].layer == layers[j - 1].layer + 1
               and layers[j].scheme == o.scheme):
            j += 1
        span = f"{o.layer}" if j - i == 1 else f"{o.layer}-{layers[j - 1].layer}"
        out += f",{o.role[0]}{span}={o.scheme.spec}"
        i = j
    return out


def _heads_spec(heads: tuple[HeadScheme, ...]) -> str:
    """The head overrides' part of the canonical spec (Go's Spec.layersString): runs of consecutive
    layers of one role, head and scheme as "k3-5h1=SCHEME"."""
    out, i = "", 0
    while i < len(heads):
        o, j = heads[i], i + 1
        while (j < len(heads) and heads[j].role == o.role and heads[j].head == o.head
               and heads[j].layer == heads[j - 1].layer + 1 and heads[j].scheme == o.scheme):
            j += 1
        span = f"{o.layer}" if j - i == 1 else f"{o.layer}-{heads[j - 1].layer}"
        out += f",{o.role[0]}{span}h{o.head}={o.scheme.spec}"
        i = j
    return out


# a per-layer or per-head override of the spec before it: k3=, kv0-5=, k3h1=
_LAYER_PART = re.compile(r"^(k|v|kv)[0-9][0-9-]*(h[0-9]+)?=")


def split_schemes(text: str) -> list[str]:
    """A list of schemes as users write it, one parser for the CLI, make and the notebooks:
    ";" separates specs that hold commas ("int4;k=asym4/g64/channel,v=q8_0"); with commas alone, a
    part that sets a role ("v=...", "k3=...", "kv0-5=...") belongs to the spec before it, so
    "int4,kivi4,k=asym4/g64,v=q8_0" is three schemes: "k=" starts one, "v=" completes a "k=" spec,
    and a per-layer override ("k3=", "kv0-5=") extends the spec before it. ("all" is the caller's.)"""
    out: list[str] = []
    for piece in text.split(";"):
        specs: list[str] = []
        for part in (p.strip() for p in piece.split(",")):
            last = specs[-1] if specs else ""
            joins = last and not last.endswith(LOSSLESS_SUFFIX) and (
                _LAYER_PART.match(part) or (part.startswith("v=") and last.startswith("k=") and ",v=" not in last))
            if joins:
                specs[-1] += "," + part
            elif part:
                specs.append(part)
        out += specs
    return out


class SchemeError(ValueError):
    """A scheme the CLI rejects; the message is the CLI's own line."""


def _check(args: tuple[str, ...]) -> Any:
    argv = [find_cli_binary(), *args]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=CLI_TIMEOUT_S, check=False)
    if proc.returncode != 0:
        line = proc.stderr.strip().splitlines()[0] if proc.stderr.strip() else f"exit status {proc.returncode}"
        raise SchemeError(line.removeprefix("kv-compress check: ").removesuffix(" (kv-compress -h for usage)"))
    return json.loads(proc.stdout)


@lru_cache(maxsize=256)
def _resolve(scheme: str, bits: int | None, group_size: int | None, sparsity: float | None,
             lossless: bool) -> CodecConfig:
    args = ["check", "-scheme", scheme] + (["-lossless"] if lossless else [])
    for flag, v in (("-bits", bits), ("-group-size", group_size), ("-sparsity", sparsity)):
        if v is not None:
            args += [flag, repr(v)]
    return CodecConfig.from_json(_check(tuple(args)))


def engine_menu(engine: str) -> list[dict[str, Any]]:
    """``kv-compress schemes -engine ENGINE`` (or ``all``): each format's name, flags, engine
    version, evidence and bits, in the engine's menu order. SchemeError names an unknown engine."""
    return list(_check(("schemes", "-engine", engine)))


@lru_cache(maxsize=1)
def engine_pairings() -> dict[str, CodecConfig]:
    """The engines' options that pair a K format with another V format under a name of their own
    (exllamav2:q6 is k=exllamav2:q8,v=exllamav2:q4), from the CLI's menu."""
    return {r["name"]: CodecConfig.from_json(r) for r in engine_menu("all") if r["name"] != r["scheme"]}


def resolve_codec(scheme: "str | CodecConfig | None" = None, bits: int | None = None, group_size: int | None = None,
                  sparsity: float | None = None, lossless: bool = False) -> CodecConfig:
    """A preset name, spec or JSON spec (with the CLI's -bits/-group-size/-sparsity
    overrides applied to both roles, and -lossless) as a validated CodecConfig.
    SchemeError names what is wrong, before anything slow has started."""
    if isinstance(scheme, CodecConfig):
        if bits is None and group_size is None and sparsity is None and (not lossless or scheme.lossless):
            return scheme
        scheme = scheme.spec
    return _resolve(scheme or DEFAULT_SCHEME, bits, group_size, sparsity, bool(lossless))


@lru_cache(maxsize=1)
def presets() -> dict[str, CodecConfig]:
    """The CLI's presets, in its order (``kv-compress schemes``)."""
    return {p["name"]: CodecConfig.from_json(p) for p in _check(("schemes",))}


@lru_cache(maxsize=1)
def preset_bits() -> dict[str, float]:
    """Each preset's nominal bits per element (the CLI's, keys and values averaged): codes and
    per-group parameters of a long 4-D cache; measured sizes come from compressing."""
    return {p["name"]: (p["key_bits_per_element"] + p["value_bits_per_element"]) / 2 for p in _check(("schemes",))}


def nominal_bits(spec: str) -> float:
    """A spec's nominal bits per element (the CLI's ``check``, keys and values averaged; per-layer
    overrides aside): for a scheme whose run produced no measured size."""
    d = _check(("check", "-scheme", spec))
    return (d["key_bits_per_element"] + d["value_bits_per_element"]) / 2


@lru_cache(maxsize=1)
def codec_gates() -> dict[str, Any]:
    """The CLI's quality levels (best first: name, max_rmse, min_snr_db) and its default quality
    gates (max_rmse, min_snr_db, min_cosine_similarity): one table, in Go."""
    return _check(("gates",))

"""The second peer: transformers' own ``QuantizedCache`` with its HQQ backend (the ``hqq``
package's ``Quantizer``: half-quadratic zero-point and scale fitting per group), through the same
windows and targets as kvlib's schemes and the quanto peer. Opt-in (``--peers hf-quanto,hf-hqq``,
``run_sweep(peers=...)``): HQQ's optimizer runs on every group of every layer, and it refuses some
cache shapes, so a sweep runs it only when asked.

Its settings are the quanto peer's where transformers' HQQ layer takes them: 4 and 2 bits, group
64, residual length 0 (the whole context quantized, as kvlib quantizes it), and **axis 1** for
keys and values: HQQ's axis 1 groups 64 consecutive elements of the tensor (along head_dim, one
token and KV head at a time), as quanto's axis 0 does. HQQ's axis 0, the layer's default, groups
64 elements lying a 64th of the tensor apart instead, a grouping no KV-cache scheme uses.

HQQ packs its codes along the groups, 8/nbits groups to a byte: a tensor whose group count is not
a multiple of 2 (4 bits) or 4 (2 bits) fails, in ``hqq.core.bitpack``'s packer (SmolLM2-135M's 3 KV
heads x 1,535 context tokens: 4,605 groups) or, where the packer broadcasts the rows it cannot pair,
in the dequantization. ``refuses`` runs HQQ's packer and unpacker on codes of each shape a run will
meet, before any window: a row refused says so (``SchemeResult.error``), it never crashes the sweep
or runs another setting.

Its storage is counted from what the layer stores: the packed uint8 codes and every tensor of the
meta (scale and zero, one each per group, in the cache's dtype: 5.0 bits/element in float32, 4.5 in
bfloat16 or float16, at 4 bits); the meta's Python fields (shape, nbits, axis...) are a handful per
tensor, not counted. Its reconstruction error is measured on the layer's own dequantization.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from kvlib.transforms.base import CacheTransform, register_peer
from kvlib.transforms.peer import PEER_BITS, PEER_GROUP, QuantizedCachePeer, package_version

HQQ_AXIS = 1  # groups of consecutive elements, as quanto's axis 0 (see the module's docstring)


def hqq_name(nbits: int) -> str:
    return f"hf-hqq-int{nbits}"


def hqq_version() -> str:
    """hqq's version ("?" when absent), as a peer unit's key names it."""
    return package_version("hqq")


def hqq_unavailable() -> str | None:
    """Why the HQQ peer cannot run here, or None when it can."""
    try:
        import hqq.core.quantize  # noqa: F401
        from transformers.cache_utils import HQQQuantizedLayer  # noqa: F401
        from transformers.utils import is_hqq_available
    except Exception as e:  # ImportError, or a broken install
        return f"hqq cannot be imported ({type(e).__name__}: {e})"
    if not is_hqq_available():
        return f"transformers does not take the installed hqq {hqq_version()} (HQQQuantizedLayer would refuse it)"
    return None


def _nbytes(q: tuple[torch.Tensor, dict[str, Any]]) -> int:
    """Bytes an HQQ-quantized tensor stores: its packed codes and every tensor of its meta."""
    codes, meta = q
    return sum(t.numel() * t.element_size() for t in (codes, *meta.values()) if isinstance(t, torch.Tensor))


class PeerRefused(ValueError):
    """A peer that cannot take a cache of this shape (its reason, in one line)."""


class HqqPeer(QuantizedCachePeer):
    """transformers' QuantizedCache with the HQQ backend, at ``nbits`` (4 or 2), group 64, axis 1,
    residual 0: one ``HQQQuantizedLayer`` per cache layer, as the quanto peer uses its layer."""

    def __init__(self, nbits: int, q_group_size: int = PEER_GROUP) -> None:
        super().__init__(nbits, q_group_size)
        self.name = hqq_name(nbits)
        self._packs: dict[int, str | None] = {}  # group count -> why HQQ cannot pack it (None: it can)

    @property
    def spec(self) -> str:
        return (f"transformers QuantizedCache, HQQ int{self.nbits}, group {self.q_group_size}, axis {HQQ_AXIS}, "
                "residual 0")

    @property
    def key(self) -> str:
        return f"{self.spec}, hqq {hqq_version()}"

    def _packing(self, groups: int) -> str | None:
        """Why HQQ's own packer cannot hold ``groups`` groups of codes (None: its unpacker gives them
        back). It raises on some counts and, by broadcasting, packs others into the wrong number of
        rows, which its dequantization then fails on."""
        if groups not in self._packs:
            from hqq.core.quantize import Quantizer

            packing = Quantizer.bit_to_packing[self.nbits]
            codes = (torch.arange(groups * self.q_group_size) % 2 ** self.nbits).to(torch.uint8)
            codes = codes.reshape(groups, self.q_group_size)
            try:
                packed = Quantizer.pack[packing](codes)
                back = Quantizer.unpack[packing](packed)
                fine = back.shape == codes.shape and torch.equal(back, codes)
                detail = (f"pack_{packing} packs them into {packed.shape[0]} rows, which unpack_{packing} "
                          f"returns as {back.shape[0]} groups")
            except Exception as e:  # a size mismatch in hqq.core.bitpack
                fine, detail = False, f"pack_{packing}: {type(e).__name__}: {e}"
            per = 8 // self.nbits
            count = f"are not a multiple of {per}" if groups % per else "do not pack"
            self._packs[groups] = None if fine else (f"{groups} groups of {self.q_group_size} {count} "
                                                     f"(hqq.core.bitpack: {detail})")
        return self._packs[groups]

    def refuses(self, shapes: list[tuple[int, str, tuple[int, ...]]]) -> str | None:
        """Why HQQ cannot quantize K/V tensors of these (layer, role, shape), the first one it cannot
        (None: it takes them all): the shape's group count as HQQ's packer meets it."""
        for layer, role, shape in shapes:
            n = math.prod(shape)
            if n % self.q_group_size:
                why = f"{n} elements are not a whole number of groups of {self.q_group_size}"
            else:
                why = self._packing(n // self.q_group_size)
            if why:
                return (f"hqq {hqq_version()} cannot quantize layer {layer}'s {role} {tuple(shape)} at "
                        f"{self.nbits} bits: {why}")
        return None

    def _layer(self, i: int, k: torch.Tensor, v: torch.Tensor) -> tuple[list[torch.Tensor], list[dict], int]:
        from transformers.cache_utils import HQQQuantizedLayer

        why = self.refuses([(i, "key", tuple(k.shape)), (i, "value", tuple(v.shape))])
        if why:  # checked before a sweep (kvlib.transforms.base.select_peers); a direct call says so too
            raise PeerRefused(why)
        # QuantizedCache(backend="hqq", nbits=..., axis_key=1, axis_value=1, residual_length=0) holds one
        # of these per layer; used layer by layer, as the quanto peer's (sliding-window models included).
        layer = HQQQuantizedLayer(nbits=self.nbits, axis_key=HQQ_AXIS, axis_value=HQQ_AXIS,
                                  q_group_size=self.q_group_size, residual_length=0)
        return self._read(layer, i, k, v, _nbytes)


@register_peer("hf-hqq", lambda: hqq_unavailable(), opt_in=True)  # looked up when asked
def hqq_peers() -> list[CacheTransform]:
    """transformers' QuantizedCache with HQQ at each of PEER_BITS (opt-in: never under peers=True)."""
    return [HqqPeer(b) for b in PEER_BITS]

"""hqq on first use, not at every model load. transformers' cache module (``cache_utils``, pinned
5.x) runs ``from hqq.core.quantize import Quantizer`` when it is imported and hqq is installed, and
hqq's module decorates with ``torch.compile``, which imports torch's dynamo and inductor: about
2.3 s of every Python process that loads a model (kv-validate, a Ray actor, a notebook kernel)
for the HQQ peer, which a run takes only when asked (``--peers hf-hqq``).

Once ``kvlib`` is imported (``install`` runs in its ``__init__``), the cache module imports without
hqq, and its ``HQQQuantizer`` is a stand-in whose first attribute read imports hqq's Quantizer:
transformers' HQQ cache layer (and kvlib's HQQ peer) work as before. A process that imported the
cache module before kvlib keeps transformers' own import.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from typing import Any

TARGET = "transformers.cache_utils"


class DeferredQuantizer:
    """``hqq.core.quantize.Quantizer``, imported on the first attribute read (``quantize``,
    ``dequantize``, ``cuda``: the class's static methods the cache layer calls)."""

    def __getattr__(self, name: str) -> Any:
        from hqq.core.quantize import Quantizer

        return getattr(Quantizer, name)


class _Loader(importlib.abc.Loader):
    """The cache module's own loader, run with transformers' hqq check answering no."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> Any:  # get_source, get_filename...: the file loader's
        return getattr(self.inner, name)

    def create_module(self, spec: Any) -> Any:
        return self.inner.create_module(spec)

    def exec_module(self, module: Any) -> None:
        import transformers.utils as utils

        real = utils.is_hqq_available
        utils.is_hqq_available = lambda *a, **k: False  # what cache_utils reads at import, and only then
        try:
            self.inner.exec_module(module)
        finally:
            utils.is_hqq_available = real
        module.is_hqq_available = real  # the layer's own check, at construction, is transformers'
        if real():
            module.HQQQuantizer = DeferredQuantizer()


class _Finder(importlib.abc.MetaPathFinder):
    """Finds the cache module as the path finder does, with _Loader around its loader (once)."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != TARGET:
            return None
        uninstall()
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _Loader(spec.loader)
        return spec


_FINDER = _Finder()


def install() -> None:
    """Defer hqq's import for the cache module, unless that module is already imported."""
    if TARGET not in sys.modules and _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)


def uninstall() -> None:
    if _FINDER in sys.meta_path:
        sys.meta_path.remove(_FINDER)

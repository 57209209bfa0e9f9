"""Run LMCache 0.5.6's own serdes on CPU: the wheel's Python files, verbatim in
tests/third_party/lmcache056 (sha256 below), loaded under their package names with the few
modules they import for plumbing (logging, config and memory-object classes, the device
singletons) stood in for here. What computes, the files' own code, runs as LMCache runs it
without an accelerator: CacheGenSerializer and CacheGenDeserializer over encode_function,
torch_quant_vectorized, calculate_cdf, the numba coder and do_dequantize (device_ops is the
torch baseline, as v1/platform/base/device_ops.py:241-251 routes it on CPU); the fp8 and kivi
serdes. Production code never imports it.

numba: when it is installed its @njit compiles the coder as in LMCache; when not, @njit is the
identity and the same Python runs interpreted (NUMBA_DISABLE_JIT's semantics: the coder masks
every value to 32 bits and stays below 2**49, so Python's integers give numba's int64 results).

LMCACHE_SRC=/path/to/unpacked/wheel instead imports the real package from the unpacked wheel (its
compiled lmcache_native stood in for: nothing here calls it on CPU); that needs LMCache's
dependencies (msgspec, cachetools, ...), which the project's environment does not have.
"""

from __future__ import annotations

import hashlib
import importlib.util
import io
import os
import pickle
import sys
import types
from enum import Enum, auto
from pathlib import Path

import torch

VERSION = "LMCache 0.5.6 (wheel, commit g3e11e108)"
ROOT = Path(__file__).parent / "third_party" / "lmcache056"
FILES = {  # path under lmcache/ -> sha256 of the wheel's file
    "v1/platform/torch_ops/cachegen_kernels.py": "f7212ee6a26e0747fdd10cfdec410fc2487b26c4c53e03ab86de19f982e2829f",
    "storage_backend/serde/serde.py": "eeddd5b9db9e596cee8aae3e1d63b4d150303f9dcf1fba01575f698797a4754f",
    "storage_backend/serde/cachegen_basics.py": "d7a2de11fa7fc5bfa7736fc09644133b825e54bae14039c224224067ca74b5f5",
    "storage_backend/serde/cachegen_encoder.py": "0f38453a31d759c1455759d6ccf387719ad5c8bdfde6b078c76ffca34b9111f4",
    "storage_backend/serde/cachegen_decoder.py": "4a33d78183a19ed3053ac1b9b6e8c25016aad2c4b4f10cac57949903f37873bd",
    "v1/storage_backend/naive_serde/serde.py": "31fedad6f01b4a78172d77892d6a9eb46cc2c7b42e85af27c221a4a6e7a68420",
    "v1/storage_backend/naive_serde/cachegen_basics.py": "042248c1c7b032b129774aec4bfd08b3cc87e4a1591a2120853bb372156ebb15",
    "v1/storage_backend/naive_serde/cachegen_encoder.py": "3179ba0cd36e791ac033ef3651babf2537f2a2e5d2ca65a65a3f6f17faf4e015",
    "v1/storage_backend/naive_serde/cachegen_decoder.py": "7cc8d9598a56b3f1c986ddb495ceef8cdffa26697c4cb30951f6231d4d339328",
    "v1/storage_backend/naive_serde/kivi_serde.py": "75d2f0e738ec21288fdb5c7def797ff8b88531ef5eca3077b3d9f78bd9f5e987",
    "v1/distributed/serde/fp8.py": "592445f0e277309965699e9916e14adc3581ad951a7706fdfdb76dd639a42a74",
}


def _module(name: str, **attrs) -> types.ModuleType:
    """A stand-in module (a package, so that submodules import) in sys.modules."""
    m = sys.modules.get(name) or types.ModuleType(name)
    m.__dict__.update(attrs)
    m.__path__ = getattr(m, "__path__", [])
    sys.modules[name] = m
    return m


class _StubCPUDevice:
    """v1/platform/devices/cpu/stub_cpu_device.py's answers: device 0, set_device a no-op."""

    def current_device(self) -> int:
        return 0

    def set_device(self, device) -> None:
        pass


class MemoryFormat(Enum):
    UNDEFINED = 0
    KV_2LTD = auto()
    BINARY_BUFFER = auto()


class MemoryObj:
    pass


class MemoryObjMetadata:
    def __init__(self, **kw):
        self.__dict__.update(kw)


class TensorMemoryObj(MemoryObj):
    """v1/memory_management.py's, as far as the serdes use it: .tensor is raw_data."""

    def __init__(self, raw_data, metadata, parent_allocator=None):
        self.raw_data, self.metadata, self._parent = raw_data, metadata, parent_allocator

    @property
    def tensor(self):
        return self.raw_data

    def parent(self):
        return self._parent


class BytesBufferMemoryObj(MemoryObj):
    """v1/memory_management.py:955-1050's, as far as the serdes use it: the bytes as given."""

    def __init__(self, raw_bytes, metadata=None):
        self.raw_data = raw_bytes

    @property
    def byte_array(self):
        return self.raw_data


class LazyMemoryAllocator:
    """Never instantiated here: the serializer's inputs are plain tensor objects."""


class _Namespace:
    def __init__(self, **kw):
        self.__dict__.update(kw)


def _load(dotted: str, path: Path) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(dotted, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[dotted] = module
    spec.loader.exec_module(module)
    return module


_LOADED: dict[str, types.ModuleType] | None = None
JIT = False  # whether numba compiled the coder


def _stub_numba() -> None:
    global JIT
    JIT = importlib.util.find_spec("numba") is not None
    if not JIT:
        _module("numba", njit=lambda *a, **k: (a[0] if a and callable(a[0]) else (lambda f: f)))


def _vendored() -> dict[str, types.ModuleType]:
    """The wheel's files under their own module names, plumbing stood in for."""
    for rel, digest in FILES.items():
        got = hashlib.sha256((ROOT / rel).read_bytes()).hexdigest()
        assert got == digest, f"tests/third_party/lmcache056/{rel} is not the wheel's file"
    _stub_numba()
    ident = lambda f: f  # noqa: E731
    if importlib.util.find_spec("transformers") is None:  # imported for AutoConfig, which cachegen() answers
        _module("transformers", AutoConfig=None)
    _module("lmcache.logging", init_logger=lambda name: __import__("logging").getLogger(name))
    _module("lmcache.utils", _lmcache_nvtx_annotate=ident)
    _module("lmcache.v1.config", LMCacheEngineConfig=object)
    _module("lmcache.v1.metadata", LMCacheMetadata=object)
    _module("lmcache.v1.gpu_connector.gpu_ops", lmcache_memcpy_async_h2d=None)
    _module("lmcache.v1.memory_allocators.lazy_memory_allocator", LazyMemoryAllocator=LazyMemoryAllocator)
    _module("lmcache.v1.memory_management", MemoryObj=MemoryObj, MemoryObjMetadata=MemoryObjMetadata, MemoryFormat=MemoryFormat,
            TensorMemoryObj=TensorMemoryObj, BytesBufferMemoryObj=BytesBufferMemoryObj)
    _module("lmcache.v1.distributed.api", MemoryLayoutDesc=object, ObjectKey=object)
    _module("lmcache.v1.distributed.serde.async_processor", AsyncSerdeProcessor=lambda *a, **k: None)
    _module("lmcache.v1.distributed.serde.base", Deserializer=object, SerdeProcessor=object, Serializer=object)
    _module("lmcache.v1.distributed.serde.factory", register_serde_factory=lambda name, factory: None)
    for pkg in ("lmcache.v1", "lmcache.v1.platform", "lmcache.v1.platform.torch_ops", "lmcache.storage_backend",
                "lmcache.storage_backend.serde", "lmcache.v1.storage_backend", "lmcache.v1.storage_backend.naive_serde",
                "lmcache.v1.distributed", "lmcache.v1.distributed.serde"):
        _module(pkg)
    root = _module("lmcache", torch_dev=_StubCPUDevice(), torch_device_type="cpu")
    kernels = _load("lmcache.v1.platform.torch_ops.cachegen_kernels", ROOT / "v1/platform/torch_ops/cachegen_kernels.py")
    root.device_ops = _Namespace(calculate_cdf=kernels.calculate_cdf, encode_fast_new=kernels.encode_fast_new,
                                 decode_fast_new=kernels.decode_fast_new, decode_fast_prefsum=kernels.decode_fast_prefsum)
    out = {}
    for rel in FILES:
        if rel.startswith("v1/platform"):
            out[rel] = kernels
            continue
        out[rel] = _load("lmcache." + rel[:-3].replace("/", "."), ROOT / rel)
    return out


def _real(src: str) -> dict[str, types.ModuleType]:
    """The unpacked wheel's package itself (LMCACHE_SRC), its C++ extension stood in for."""
    global JIT
    import importlib

    class _Meta(type):
        n = 1000

        def __getattr__(cls, name):
            if name.startswith("__"):
                raise AttributeError(name)
            _Meta.n += 1  # a distinct int: some modules key tables by int(format)
            setattr(cls, name, _Meta.n)
            return _Meta.n

    class _Native(types.ModuleType):
        def __getattr__(self, name):
            if name.startswith("__"):
                raise AttributeError(name)
            cls = _Meta(name, (), {"__init__": lambda self, *a, **k: None})
            setattr(self, name, cls)
            return cls

    sys.path.insert(0, src)
    sys.modules["lmcache.lmcache_native"] = _Native("lmcache.lmcache_native")
    JIT = True  # the package imports numba itself
    return {rel: importlib.import_module("lmcache." + rel[:-3].replace("/", ".")) for rel in FILES}


def modules() -> dict[str, types.ModuleType]:
    global _LOADED
    if _LOADED is None:
        src = os.environ.get("LMCACHE_SRC")
        _LOADED = _real(src) if src else _vendored()
    return _LOADED


def cachegen(kv: torch.Tensor, heads: int, head_dim: int, layers: int | None = None, model_name: str = "kvlib/test"):
    """CacheGenSerializer.serialize and CacheGenDeserializer.deserialize of one KV_2LTD chunk object
    [2, L, n, heads*head_dim] (n <= 256), for a model of ``layers`` layers (CacheGenConfig looks the
    count up with AutoConfig, answered here): the stored bytes (the pickle), the unpickled
    CacheGenGPUEncoderOutput, and the restored tensor."""
    m = modules()
    basics = m["v1/storage_backend/naive_serde/cachegen_basics.py"]
    basics.AutoConfig = _Namespace(from_pretrained=lambda name: _Namespace(num_hidden_layers=layers or kv.shape[1]))
    config = _Namespace(chunk_size=256)
    meta = _Namespace(model_name=model_name, kv_dtype=kv.dtype, kv_shape=(kv.shape[1], 2, 256, heads, head_dim))
    ser = m["v1/storage_backend/naive_serde/cachegen_encoder.py"].CacheGenSerializer(config, meta)
    des = m["v1/storage_backend/naive_serde/cachegen_decoder.py"].CacheGenDeserializer(config, meta)
    obj = TensorMemoryObj(kv.contiguous(), None)
    stored = ser.serialize(obj)
    raw = bytes(stored.byte_array)
    with io.BytesIO(raw) as f:
        out = pickle.load(f)
    back = des.deserialize(stored).tensor
    return raw, out, back


def fp8(x: torch.Tensor) -> tuple[bytes, torch.Tensor]:
    """The fp8 serde's serialize into a byte buffer and deserialize back into x's dtype and shape."""
    m = modules()["v1/distributed/serde/fp8.py"]
    dst = _Namespace(tensor=torch.zeros(x.numel(), dtype=torch.uint8))
    n = m.Fp8QuantizationSerializer().serialize(_Namespace(tensor=x), dst, None)
    out = _Namespace(tensor=torch.empty_like(x))
    m.Fp8QuantizationDeserializer().deserialize(_Namespace(tensor=dst.tensor[:n]), out, None)
    return dst.tensor[:n].numpy().tobytes(), out.tensor


def kivi(x: torch.Tensor):
    """The kivi serde's serialize and deserialize of a memory object holding x: what comes back."""
    m = modules()["v1/storage_backend/naive_serde/kivi_serde.py"]
    obj = TensorMemoryObj(x, None)
    return m.KIVIDeserializer().deserialize(m.KIVISerializer().serialize(obj))

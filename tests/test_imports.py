"""The house: kvlib's imports flow one way (model -> cache -> codec -> ... -> report), with no circle
and no function-local import of kvlib; users import from ``kvlib`` itself; the results store's code
identity covers every subpackage; the package list ships every subpackage."""

from __future__ import annotations

import ast
import importlib
import pkgutil
import tomllib
from pathlib import Path

import kvlib

KVLIB = Path(kvlib.__file__).parent

# Each room's floor: a module imports only from its own room or from rooms on lower floors.
FLOORS = {
    "env": 0, "dtypes": 0, "gates": 0, "_lazy": 0, "_hqq_deferred": 0,
    "cache": 1,
    "codec": 2, "models": 2,
    "transforms": 3,
    "scoring": 4,
    "budget": 5, "checks": 5,
    "runs": 6,
    "report": 7,
    "cli": 8, "lab": 8, "__init__": 8, "__main__": 9,
}


def _modules() -> dict[str, Path]:
    return {".".join(p.relative_to(KVLIB).with_suffix("").parts): p for p in KVLIB.rglob("*.py")}


def _room(module: str) -> str:
    return module.split(".")[0]


def _imports(path: Path) -> list[tuple[str, bool]]:
    """(kvlib module imported, whether the import is inside a function) for each kvlib import."""
    tree = ast.parse(path.read_text())
    local = {id(n) for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
             for n in ast.walk(f) if n is not f}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("kvlib"):
            base = node.module.removeprefix("kvlib").lstrip(".")
            targets = [f"{base}.{a.name}".lstrip(".") for a in node.names]
            mods = _modules()
            for t in targets:
                out.append((t if t in mods else base, id(node) in local))
        elif isinstance(node, ast.Import):
            out += [(a.name.removeprefix("kvlib").lstrip("."), id(node) in local) for a in node.names
                    if a.name.startswith("kvlib")]
    return [(m or "__init__", loc) for m, loc in out]


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    graph = {}
    for m, p in mods.items():
        if m.endswith("__init__"):
            continue  # a package's lazy re-exports import nothing
        graph[m] = {t for t, _ in _imports(p) if t != m and not t.endswith("__init__") and t in mods}
    return graph


def test_every_room_has_a_floor():
    rooms = {_room(m) for m in _modules()}
    assert rooms <= set(FLOORS), f"rooms without a floor: {rooms - set(FLOORS)}"


def test_imports_flow_down_only():
    wrong = [f"{m} -> {t}" for m, ts in _graph().items() for t in ts
             if _room(t) != _room(m) and FLOORS[_room(t)] >= FLOORS[_room(m)]]
    assert not wrong, "imports that go up or sideways: " + "; ".join(sorted(wrong))


def test_no_import_circle():
    graph, state, circles = _graph(), {}, []

    def visit(m: str, path: list[str]) -> None:
        state[m] = "open"
        for t in graph.get(m, ()):
            if state.get(t) == "open":
                circles.append(" -> ".join(path[path.index(t):] + [t]))
            elif t not in state:
                visit(t, path + [t])
        state[m] = "done"

    for m in graph:
        if m not in state:
            visit(m, [m])
    assert not circles, circles


def test_no_function_local_kvlib_import():
    local = [f"{m} imports {t}" for m, p in _modules().items() for t, loc in _imports(p) if loc]
    assert not local, local


def test_the_graph_test_sees_a_circle(tmp_path, monkeypatch):
    """The walker is not blind: a circle planted between two rooms is found."""
    graph = {"a.x": {"b.y"}, "b.y": {"a.x"}}
    monkeypatch.setattr(__import__(__name__), "_graph", lambda: graph)
    try:
        test_no_import_circle()
    except AssertionError as e:
        assert "a.x" in str(e)
    else:
        raise AssertionError("a planted circle was not found")


def test_users_import_from_kvlib():
    """The design documents' API and the sweep's entry points, from kvlib itself."""
    from kvlib import (compress_kv_cache, compute_perplexity, decompress_kv_cache, extract_kv_cache,  # noqa: F401
                       load_kv_cache, run_full_validation, run_quick_test, run_sweep, save_kv_cache)
    for name in kvlib.__all__:
        assert getattr(kvlib, name) is not None, name
    for sub in ("cache", "codec", "transforms", "models", "scoring", "checks", "budget", "runs", "report"):
        pkg = importlib.import_module(f"kvlib.{sub}")
        for name in pkg.__all__:
            assert getattr(pkg, name) is not None, f"kvlib.{sub}.{name}"


def test_every_module_imports():
    for m in pkgutil.walk_packages(kvlib.__path__, "kvlib."):
        if not m.name.endswith("__main__"):
            importlib.import_module(m.name)


def test_code_identity_covers_every_subpackage():
    """A change anywhere in kvlib changes every results-store key: the identity hashes each file."""
    from kvlib.scoring.provenance import code_files

    files = {p.relative_to(KVLIB).as_posix() for p in code_files()}
    assert files == {p.relative_to(KVLIB).as_posix() for p in KVLIB.rglob("*.py")}
    assert {"runs/sweep.py", "codec/spec.py", "report/common.py", "gates.py"} <= files


def test_code_identity_changes_with_a_subpackage_file(tmp_path, monkeypatch):
    from kvlib.scoring import provenance

    copy = tmp_path / "kvlib"
    for p in KVLIB.rglob("*.py"):
        (copy / p.relative_to(KVLIB)).parent.mkdir(parents=True, exist_ok=True)
        (copy / p.relative_to(KVLIB)).write_bytes(p.read_bytes())
    cli = tmp_path / "cli"
    cli.write_bytes(b"binary")
    monkeypatch.setattr(provenance, "_KVLIB", copy)
    before = provenance.code_identity.__wrapped__(str(cli))
    (copy / "runs" / "sweep.py").write_text((copy / "runs" / "sweep.py").read_text() + "\n# changed\n")
    assert provenance.code_identity.__wrapped__(str(cli)) != before


def test_pyproject_ships_every_subpackage():
    config = tomllib.loads((KVLIB.parent / "pyproject.toml").read_text())
    find = config["tool"]["setuptools"].get("packages")
    listed = set(find) if isinstance(find, list) else None
    pkgs = {".".join(p.parent.relative_to(KVLIB.parent).parts) for p in KVLIB.rglob("__init__.py")}
    if listed is not None:
        assert pkgs <= listed, f"not in pyproject.toml's packages: {pkgs - listed}"
    else:  # packages.find
        assert find["find"]["include"] == ["kvlib*"]


def test_the_built_in_peers_are_registered_by_whoever_builds_transforms():
    """A sweep run from the CLI imports nothing of the peers' module itself: building transforms
    registers them (a fresh interpreter, as kv-validate starts)."""
    import subprocess
    import sys

    code = ("import kvlib.runs.sweep\nfrom kvlib.transforms.base import peer_transforms\n"
            "print(sorted(t.name for t in peer_transforms()))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "hf-quanto-int4" in out and "hf-quanto-int2" in out

"""make lab as users start it: JupyterLab comes up as this user (root or not) on a
free local port, lists the kvlib kernel and every notebook through its REST API,
runs a cell of quick_test.ipynb in the kvlib kernel, and stops leaving no process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.request
import uuid
from pathlib import Path

import pytest

from kvlib import lab

REPO = Path(__file__).resolve().parent.parent
NOTEBOOKS = REPO / "notebooks"


def _get(base: str, path: str, token: str, method: str = "GET", body: dict | None = None) -> dict:
    req = urllib.request.Request(f"{base}{path}", method=method, data=json.dumps(body).encode() if body else None,
                                 headers={"Authorization": f"token {token}", "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        data = r.read()
    return json.loads(data) if data else {}


def _execute(base: str, kernel: str, token: str, code: str, timeout: float = 120) -> tuple[str, list[str]]:
    """Run ``code`` in a kernel through the server's websocket; (status, stream texts and errors)."""
    import websocket

    ws = websocket.create_connection(f"{base.replace('http', 'ws', 1)}/api/kernels/{kernel}/channels?token={token}",
                                     timeout=timeout)
    msg_id = uuid.uuid4().hex
    ws.send(json.dumps({"header": {"msg_id": msg_id, "msg_type": "execute_request", "username": "test",
                                   "session": uuid.uuid4().hex, "version": "5.3"},
                        "parent_header": {}, "metadata": {}, "channel": "shell",
                        "content": {"code": code, "silent": False, "store_history": False, "user_expressions": {},
                                    "allow_stdin": False, "stop_on_error": True}}))
    out, status, deadline = [], None, time.time() + timeout
    try:
        while status is None and time.time() < deadline:
            m = json.loads(ws.recv())
            if m.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            kind = m["header"]["msg_type"]
            if kind == "stream":
                out.append(m["content"]["text"])
            elif kind == "error":
                out.append(f"{m['content']['ename']}: {m['content']['evalue']}")
            elif kind == "execute_reply":
                status = m["content"]["status"]
    finally:
        ws.close()
    return status or "timeout", out


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    port, token = lab.free_port(), uuid.uuid4().hex
    runtime = tmp_path_factory.mktemp("runtime")
    env = {**os.environ, "JUPYTER_RUNTIME_DIR": str(runtime)}
    proc = subprocess.Popen(lab.lab_command(NOTEBOOKS, port, lab.DEFAULT_IP, token), env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 90
        while True:
            if proc.poll() is not None:
                pytest.fail(f"jupyter lab exited with {proc.returncode}: {proc.stdout.read().decode()[-2000:]}")
            try:
                _get(base, "/api/status", token)
                break
            except OSError:
                if time.time() > deadline:
                    pytest.fail("jupyter lab did not answer within 90 s")
                time.sleep(0.5)
        yield base, token, proc, runtime
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def test_allow_root_only_for_root():
    cmd = lab.lab_command(NOTEBOOKS, 9999, "127.0.0.1", "t")
    assert ("--allow-root" in cmd) == (os.geteuid() == 0)
    assert "--ServerApp.ip=127.0.0.1" in cmd and "--no-browser" in cmd
    assert lab.url("127.0.0.1", 9999, "t") == "http://localhost:9999/lab?token=t"


def test_kernel_and_notebooks_are_listed(server):
    base, token, _, _ = server
    assert "kvlib" in _get(base, "/api/kernelspecs", token)["kernelspecs"]
    names = {c["name"] for c in _get(base, "/api/contents", token)["content"]}
    assert {p.name for p in NOTEBOOKS.glob("*.ipynb")} <= names
    assert {"quick_test.ipynb", "validate_perplexity.ipynb", "sweep.ipynb", "zoo.ipynb"} <= names


def test_quick_test_cell_runs_in_the_kvlib_kernel(server, tmp_path):
    base, token, _, _ = server
    nb = json.loads((NOTEBOOKS / "quick_test.ipynb").read_text())
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    params, first = "".join(code[0]["source"]), "".join(code[1]["source"])
    kernel = _get(base, "/api/kernels", token, "POST", {"name": "kvlib"})["id"]
    try:
        status, out = _execute(base, kernel, token, params + f"\noutput_dir = {str(tmp_path)!r}\n")
        assert status == "ok", out
        status, out = _execute(base, kernel, token, first + "\nprint('PASSED' if result.passed else 'FAILED')")
        assert status == "ok", out
        assert "PASSED" in "".join(out)
        assert (tmp_path / "quick_test.json").is_file()
    finally:
        _get(base, f"/api/kernels/{kernel}", token, "DELETE")


def test_server_stops_and_leaves_no_process(server):
    base, token, proc, runtime = server
    kernel = _get(base, "/api/kernels", token, "POST", {"name": "kvlib"})["id"]  # left running on purpose
    deadline = time.time() + 30
    while not any(kernel in p for p in _processes(group=-1, cmdline=str(runtime))) and time.time() < deadline:
        time.sleep(0.2)  # the probe below must see the kernel while it runs
    assert any(kernel in p for p in _processes(group=-1, cmdline=str(runtime)))
    os.killpg(proc.pid, signal.SIGTERM)
    assert proc.wait(timeout=30) is not None
    time.sleep(1)
    left = _processes(group=proc.pid, cmdline=str(runtime))  # the server's group, and any kernel it started
    assert left == [], f"processes left after the server stopped ({kernel}): {left}"


def _processes(group: int, cmdline: str) -> list[str]:
    """Live processes in process group ``group`` or whose command line mentions ``cmdline`` (from /proc)."""
    found = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
            args = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # gone meanwhile
            continue
        fields = stat.rsplit(")", 1)[1].split()
        state, pgrp = fields[0], int(fields[2])
        if state != "Z" and (pgrp == group or cmdline in args):
            found.append(f"{d.name}: {args}")
    return found

"""``make lab``: JupyterLab on ``notebooks/`` with the project's kernel, started the
way users start it: as root in a container or on a GPU box (``--allow-root`` only
then, said in one line), bound to localhost unless asked otherwise, the URL with
its token printed, the port and address from ``LAB_PORT`` / ``LAB_IP``.

``python -m kvlib.lab [--port N] [--ip ADDR] [--notebook-dir DIR]``
"""

from __future__ import annotations

import argparse
import os
import secrets
import socket
import sys
from pathlib import Path

DEFAULT_IP = "127.0.0.1"
DEFAULT_PORT = 8888


def free_port(ip: str = DEFAULT_IP) -> int:
    """A TCP port nothing listens on now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((ip, 0))
        return int(s.getsockname()[1])


def is_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0


def lab_command(notebook_dir: str | os.PathLike, port: int, ip: str, token: str) -> list[str]:
    """The jupyter lab command line: no browser, the given token, --allow-root only for root."""
    cmd = [sys.executable, "-m", "jupyter", "lab", "--no-browser", f"--notebook-dir={notebook_dir}",
           f"--ServerApp.ip={ip}", f"--ServerApp.port={port}", "--ServerApp.port_retries=0",
           f"--IdentityProvider.token={token}"]
    if is_root():
        cmd.append("--allow-root")
    return cmd


def url(ip: str, port: int, token: str) -> str:
    host = "localhost" if ip in ("127.0.0.1", "localhost", "::1") else ip
    return f"http://{host}:{port}/lab?token={token}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="make lab", description="JupyterLab on the kvlib notebooks")
    p.add_argument("--port", type=int, default=int(os.environ.get("LAB_PORT") or DEFAULT_PORT))
    p.add_argument("--ip", default=os.environ.get("LAB_IP") or DEFAULT_IP)
    p.add_argument("--notebook-dir", default=str(Path(__file__).resolve().parent.parent / "notebooks"))
    args = p.parse_args(argv)
    if not Path(args.notebook_dir).is_dir():
        print(f"make lab: error: {args.notebook_dir}: no such notebook directory", file=sys.stderr)
        return 2
    token = os.environ.get("LAB_TOKEN") or secrets.token_hex(24)
    cmd = lab_command(args.notebook_dir, args.port, args.ip, token)
    if is_root():
        print("make lab: running as root (a container or a GPU box): passing --allow-root to JupyterLab", flush=True)
    if args.ip not in ("127.0.0.1", "localhost", "::1"):
        print(f"make lab: listening on {args.ip}: anyone who can reach it and has the token can run code here",
              flush=True)
    print(f"make lab: open {url(args.ip, args.port, token)}", flush=True)
    os.execv(sys.executable, cmd)  # JupyterLab takes over this process: Ctrl-C stops it, nothing is left behind
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())

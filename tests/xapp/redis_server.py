"""A private redis-server on a free loopback port, for tests of the xApp's SDL store.

``redis-server`` comes from the Debian package (``.ci/run`` installs it). :func:`redis_or_skip`
skips a test only when the binary is absent. The server keeps nothing on disk (no RDB, no AOF)
and is killed when the context ends.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from contextlib import contextmanager
from collections.abc import Iterator

import pytest

REDIS = "redis-server"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


@contextmanager
def redis_server(startup_s: float = 10.0) -> Iterator[int]:
    """Start redis-server on 127.0.0.1 and yield its port; stop it afterwards.

    Raises RuntimeError (with the server's output) if it does not answer PING in ``startup_s``
    (three tries on fresh ports, in case another process took the port first)."""
    binary = shutil.which(REDIS)
    if binary is None:
        raise FileNotFoundError(REDIS)
    out = ""
    for _ in range(3):
        port = _free_port()
        proc = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1",
                                 "--save", "", "--appendonly", "no", "--daemonize", "no"],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + startup_s
        while time.monotonic() < deadline and proc.poll() is None and not _answers(port):
            time.sleep(0.02)
        if proc.poll() is None and _answers(port):
            try:
                yield port
            finally:
                proc.terminate()
                try:
                    proc.wait(5)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
                proc.stdout.close()
            return
        proc.kill()
        out = proc.communicate()[0].decode(errors="replace")
    raise RuntimeError(f"redis-server did not start: {out[-2000:]}")


def redis_or_skip() -> None:
    """Skip the calling test when the redis-server binary is absent (and only then)."""
    if shutil.which(REDIS) is None:
        pytest.skip("redis-server not installed (apt-get install -y redis-server; "
                    ".ci/run installs it)")

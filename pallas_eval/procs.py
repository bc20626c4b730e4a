"""Process supervision for the replay: every process the harness starts, and only those, is
stopped on exit, on an exception and on Ctrl-C/SIGTERM.

Each child runs in its own session (``start_new_session=True``), so it leads a process group
holding everything it spawns (vLLM's EngineCore and worker processes included). Stopping sends
SIGTERM to that group, waits ``grace_s``, then SIGKILLs the group. The supervisor registers an
``atexit`` hook and SIGINT/SIGTERM handlers (restoring the previous ones when closed).
"""

from __future__ import annotations

import atexit
import os
import signal
import socket
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import structlog

from agent.server import free_port  # noqa: F401 - one implementation, re-exported

log = structlog.get_logger("pallas.procs")


@dataclass
class Child:
    """A started process: its name, Popen, process group id and log file."""

    name: str
    popen: subprocess.Popen
    pgid: int
    log_path: Path | None = None
    group_pids: set[int] = field(default_factory=set)
    extra_pgids: set[int] = field(default_factory=set)

    def alive(self) -> bool:
        return self.popen.poll() is None


def _proc_table() -> dict[int, tuple[str, int, int]]:
    """pid -> (state, ppid, pgrp) of every process (Linux /proc; empty elsewhere)."""
    out: dict[int, tuple[str, int, int]] = {}
    for d in Path("/proc").iterdir() if Path("/proc").exists() else ():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
            rest = stat[stat.rindex(")") + 2:].split()   # state ppid pgrp ...
            out[int(d.name)] = (rest[0], int(rest[1]), int(rest[2]))
        except (OSError, ValueError, IndexError):
            continue
    return out


def group_members(pgid: int) -> set[int]:
    """Pids of live (non-zombie) processes whose process group is ``pgid``."""
    return {pid for pid, (st, _, pg) in _proc_table().items() if pg == pgid and st != "Z"}


def descendants(pid: int) -> dict[int, int]:
    """Live descendants of ``pid`` (any depth) -> their process group ids. A child that moved
    to its own session (vLLM started with start_new_session) is still found through its ppid."""
    table = _proc_table()
    kids: dict[int, list[int]] = {}
    for p, (_, pp, _) in table.items():
        kids.setdefault(pp, []).append(p)
    out: dict[int, int] = {}
    stack = list(kids.get(pid, []))
    while stack:
        p = stack.pop()
        if p in out:
            continue
        st, _, pg = table[p]
        if st != "Z":
            out[p] = pg
        stack.extend(kids.get(p, []))
    return out




def wait_port(host: str, port: int, timeout_s: float, child: Child | None = None) -> None:
    """Wait until ``host:port`` accepts a TCP connection. Raises TimeoutError, or RuntimeError
    if ``child`` exits first (with the tail of its log)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if child is not None and not child.alive():
            raise RuntimeError(f"{child.name} exited with {child.popen.returncode} while starting"
                               + tail_hint(child))
        try:
            with socket.create_connection((host, port), timeout=1.0):
                return
        except OSError:
            time.sleep(0.25)
    raise TimeoutError(f"{host}:{port} not up after {timeout_s:.0f} s"
                       + (tail_hint(child) if child else ""))


def tail_hint(child: Child, lines: int = 15) -> str:
    if child.log_path is None or not child.log_path.exists():
        return ""
    txt = child.log_path.read_text(errors="replace").splitlines()[-lines:]
    return f"\n--- last lines of {child.log_path} ---\n" + "\n".join(txt)


class Supervisor:
    """Starts child processes and guarantees they are gone when the harness ends.

    Use as a context manager. ``start`` returns a Child; ``stop`` ends one; ``close`` ends all
    (reverse start order). ``started_pids`` records every pid ever seen in a child's group, so a
    test can check none is left.
    """

    def __init__(self, log_dir: Path | str, grace_s: float = 5.0) -> None:
        self.log_dir = Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.grace_s = grace_s
        self.children: list[Child] = []
        self.started_pids: set[int] = set()
        self._lock = threading.Lock()
        self._closed = False
        self._old_handlers: dict[int, object] = {}
        atexit.register(self.close)
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._old_handlers[sig] = signal.signal(sig, self._on_signal)

    def __enter__(self) -> "Supervisor":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _on_signal(self, signum, frame) -> None:
        log.warning("signal, stopping children", signal=signum)
        self.close()
        raise KeyboardInterrupt if signum == signal.SIGINT else SystemExit(128 + signum)

    def start(self, name: str, argv: Sequence[str], *, env: dict[str, str] | None = None,
              cwd: str | Path | None = None) -> Child:
        """Start ``argv`` as its own process group, stdout+stderr to ``<log_dir>/<name>.log``."""
        if self._closed:
            raise RuntimeError("supervisor closed")
        log_path = self.log_dir / f"{name}.log"
        fh = open(log_path, "ab")
        full_env = dict(os.environ)
        if env:
            full_env.update(env)
        p = subprocess.Popen(list(argv), stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             env=full_env, cwd=str(cwd) if cwd else None, start_new_session=True)
        fh.close()
        c = Child(name, p, p.pid, log_path, {p.pid})
        with self._lock:
            self.children.append(c)
            self.started_pids.add(p.pid)
        log.info("started", name=name, pid=p.pid, log=str(log_path))
        return c

    def refresh(self) -> None:
        """Record the pids now in each child's group and below it (vLLM spawns its engine
        processes late, and an agent starts vLLM in a session of its own)."""
        for c in list(self.children):
            m = group_members(c.pgid)
            for pid in list(m):
                for d, pg in descendants(pid).items():
                    m.add(d)
                    if pg != c.pgid:
                        c.extra_pgids.add(pg)
            c.group_pids |= m
            self.started_pids |= m

    def stop(self, c: Child) -> None:
        """SIGTERM the child's group, wait up to grace_s, SIGKILL what is left."""
        self.refresh()

        def left() -> set[int]:
            pids = group_members(c.pgid)
            for pg in c.extra_pgids:
                pids |= group_members(pg)
            return pids

        # SIGTERM the child's own group first (it stops what it started), then everything.
        for sig, wait, groups in ((signal.SIGTERM, self.grace_s, [c.pgid]),
                                  (signal.SIGTERM, 2.0, sorted(c.extra_pgids)),
                                  (signal.SIGKILL, 2.0, [c.pgid, *sorted(c.extra_pgids)])):
            for pg in groups:
                try:
                    os.killpg(pg, sig)
                except (ProcessLookupError, PermissionError):
                    pass
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline:
                c.popen.poll()
                if not left():
                    break
                time.sleep(0.1)
            if not left():
                break
        try:
            c.popen.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            pass
        with self._lock:
            if c in self.children:
                self.children.remove(c)
        log.info("stopped", name=c.name, pid=c.popen.pid, rc=c.popen.returncode)

    def close(self) -> None:
        """Stop every child (reverse start order); idempotent; restores signal handlers."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            kids = list(reversed(self.children))
        for c in kids:
            try:
                self.stop(c)
            except Exception as e:  # keep stopping the others
                log.error("stop failed", name=c.name, error=repr(e))
        if threading.current_thread() is threading.main_thread():
            for sig, h in self._old_handlers.items():
                try:
                    signal.signal(sig, h)  # type: ignore[arg-type]
                except (TypeError, ValueError):
                    pass
        try:
            atexit.unregister(self.close)
        except Exception:
            pass

    def leftovers(self) -> set[int]:
        """Pids recorded as started that are still alive (not zombies)."""
        alive = set()
        for pid in self.started_pids:
            try:
                st = Path(f"/proc/{pid}/stat").read_text()
                if st[st.rindex(")") + 2] != "Z":
                    alive.add(pid)
            except (OSError, ValueError):
                continue
        return alive

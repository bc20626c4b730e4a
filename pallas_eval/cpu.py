"""CPU time of the processes the harness started, per process, from the kernel's counters (psutil).

:class:`CpuSampler` follows process trees (an agent, the vLLM API server it launched, vLLM's
EngineCore and worker processes) and reports, between two snapshots, each process's CPU time
(user + system seconds) as a share of one core over the wall time between them. A process that
ended between the snapshots is counted up to its last sample (its final CPU time is lost, as
the kernel forgets it), one that started in between from zero.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Iterable

import psutil

__all__ = ["CpuSample", "CpuSampler", "label_of", "cpu_share"]


def label_of(proc: psutil.Process) -> str:
    """A short role name for a process of the replay: ``agent``, ``vllm-api``,
    ``vllm-engine`` (EngineCore), ``vllm-worker``, ``xapp`` or its process name."""
    try:
        name = proc.name()
        cmd = " ".join(proc.cmdline())
    except (psutil.Error, OSError):
        return "?"
    if "EngineCore" in name or "EngineCore" in cmd:
        return "vllm-engine"
    if "Worker" in name or "VllmWorker" in cmd:
        return "vllm-worker"
    if "vllm.entrypoints" in cmd:
        return "vllm-api"
    if "agent.main" in cmd or "pallas-agent" in cmd:
        return "agent"
    if "xapp.main" in cmd:
        return "xapp"
    return name or "?"


@dataclass
class CpuSample:
    """One snapshot: wall time (s, monotonic) and pid -> (label, root name, CPU seconds)."""

    t: float
    procs: dict[int, tuple[str, str, float]] = field(default_factory=dict)


def cpu_share(before: CpuSample, after: CpuSample) -> dict[str, float]:
    """``root/label`` -> CPU seconds used between the snapshots / wall seconds (1.0 = one core).
    Several processes with the same root and label are summed.

    Raises:
        ValueError: ``after`` is not later than ``before``.
    """
    wall = after.t - before.t
    if wall <= 0:
        raise ValueError("the second snapshot must be later than the first")
    out: dict[str, float] = {}
    for pid, (label, root, cpu) in after.procs.items():
        prev = before.procs.get(pid)
        used = cpu - (prev[2] if prev and prev[:2] == (label, root) else 0.0)
        key = f"{root}/{label}"
        out[key] = out.get(key, 0.0) + max(0.0, used) / wall
    return out


class CpuSampler:
    """Snapshots of the CPU time of named process trees.

    Usage: ``s = CpuSampler({"edge-0": pid0, ...}); a = s.snapshot(); ...; b = s.snapshot();
    cpu_share(a, b)``.
    """

    def __init__(self, roots: dict[str, int] | None = None) -> None:
        self.roots: dict[str, int] = dict(roots or {})
        self.alone: set[str] = set()
        self._procs: dict[int, psutil.Process] = {}

    def add(self, name: str, pid: int, *, alone: bool = False) -> None:
        """Follow the tree rooted at ``pid`` under ``name`` (only that process with ``alone``)."""
        self.roots[name] = pid
        if alone:
            self.alone.add(name)

    def _tree(self, pid: int, alone: bool = False) -> Iterable[psutil.Process]:
        try:
            root = self._procs.get(pid) or psutil.Process(pid)
            self._procs[pid] = root
            yield root
            if alone:
                return
            for p in root.children(recursive=True):
                # one Process object per pid keeps psutil's identity check (pid reuse)
                yield self._procs.setdefault(p.pid, p)
        except (psutil.Error, OSError):
            return

    def snapshot(self) -> CpuSample:
        """CPU seconds of every live process in the trees, now."""
        s = CpuSample(time.monotonic())
        for name, pid in self.roots.items():
            for p in self._tree(pid, name in self.alone):
                try:
                    c = p.cpu_times()
                    s.procs[p.pid] = (label_of(p), name, float(c.user + c.system))
                except (psutil.Error, OSError):
                    continue
        return s

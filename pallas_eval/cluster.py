"""Local agent processes for tests, benchmarks and the replay job.

:class:`LocalAgent` runs one ``pallas-agent`` (``python -m agent.main``) as a subprocess in
its own process group, with its own vLLM server (launched by the agent), and gives typed
access to its three endpoints: the Control gRPC stub, the UE front URL and ``/metrics``.
:func:`start_agents` starts several at once (vLLM start-up dominates, so they overlap) with
each one's front registered at the others (``--peer-front``).

Links (issue 16): an agent serves mutual TLS unless it is told ``insecure``. :func:`provision_tls`
makes a throwaway CA (pallas_eval.localca) and gives each agent its certificate (CN = its
agent id, through ``PALLAS_TLS_CERT/KEY/CA``) and the harness the xApp's (CN ``pallas-xapp``),
which :meth:`LocalAgent.control` and the readiness check present; :func:`start_agents` does it
for every agent that has neither certificate nor ``insecure``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import httpx
from grpc_health.v1 import health_pb2, health_pb2_grpc
from pallas_proto import pallas_pb2, pallas_pb2_grpc

from agent.server import free_port, tail_lines  # free_port: below the ephemeral range
from pallas_common.tls import ENV_CA, ENV_CERT, ENV_KEY, TlsFiles, channel_credentials

REPO_ROOT = Path(__file__).resolve().parent.parent
XAPP_IDENTITY = "pallas-xapp"
"""The xApp's certificate CN, the agents' default ``--xapp-identity``."""

__all__ = ["LocalAgent", "start_agents", "provision_tls", "free_port", "XAPP_IDENTITY"]


@dataclass
class LocalAgent:
    """One ``pallas-agent`` subprocess on loopback.

    Args:
        agent_id: the agent's id.
        model: model folder to serve.
        omp_bind: ``VLLM_CPU_OMP_THREADS_BIND`` of its vLLM ("0", "1", "auto").
        extra: more ``pallas-agent`` flags (e.g. ``["--peer-rate-mbps", "300"]``).
        env: more environment variables (inherited by its vLLM server too).
        log_dir: where the agent's log (JSON lines, with vLLM's log next to it) goes.
        tls: the agent's certificate, key and CA (passed as ``PALLAS_TLS_*``); None with
            ``insecure`` (plaintext, ``--insecure``) or until :func:`provision_tls` sets it.
        client_tls: the certificate the harness presents to this agent's Control service and
            health check (the xApp's; :func:`provision_tls` sets it).
    """

    agent_id: str
    model: str
    omp_bind: str = "auto"
    extra: list[str] = field(default_factory=list)
    log_dir: str = str(REPO_ROOT / ".cache" / "logs")
    env: dict[str, str] = field(default_factory=dict)
    control_port: int = field(default_factory=free_port)
    peer_port: int = field(default_factory=free_port)
    front_port: int = field(default_factory=free_port)
    proc: subprocess.Popen | None = None
    insecure: bool = False
    tls: TlsFiles | None = None
    client_tls: TlsFiles | None = None

    @property
    def tls_env(self) -> dict[str, str]:
        """``PALLAS_TLS_CERT/KEY/CA`` of the agent's certificate (empty without one)."""
        if self.tls is None:
            return {}
        return {ENV_CERT: str(self.tls.cert), ENV_KEY: str(self.tls.key), ENV_CA: str(self.tls.ca)}

    def channel(self, aio: bool = False) -> grpc.Channel | grpc.aio.Channel:
        """A channel to the Control port (``aio``: grpc.aio's): mutual TLS with ``client_tls``
        (the server's certificate checked against the agent id), else plaintext."""
        mod = grpc.aio if aio else grpc
        if self.client_tls is None:
            return mod.insecure_channel(self.control_address)
        return mod.secure_channel(self.control_address, channel_credentials(self.client_tls.read()),
                                  options=[("grpc.ssl_target_name_override", self.agent_id)])

    @property
    def front_url(self) -> str:
        """The UE front, ``http://127.0.0.1:<port>``."""
        return f"http://127.0.0.1:{self.front_port}"

    @property
    def control_address(self) -> str:
        """host:port of the Control gRPC service."""
        return f"127.0.0.1:{self.control_port}"

    @property
    def endpoint(self) -> pallas_pb2.PeerEndpoint:
        """This agent as a migration target (its PeerTransfer endpoint)."""
        return pallas_pb2.PeerEndpoint(agent_id=self.agent_id, address=f"127.0.0.1:{self.peer_port}")

    @property
    def log_path(self) -> str:
        """The agent's own log (JSON lines)."""
        return os.path.join(self.log_dir, f"agent-{self.agent_id}-{self.front_port}.log")

    @property
    def vllm_log_path(self) -> str:
        """The log of the vLLM server the agent launches (beside the agent's)."""
        return os.path.join(self.log_dir, f"vllm-{self.agent_id}-{self.front_port}.log")

    def command(self, peer_fronts: dict[str, str] | None = None) -> list[str]:
        """The agent's command line."""
        cmd = [sys.executable, "-m", "agent.main", "--agent-id", self.agent_id, "--model", self.model,
               "--host", "127.0.0.1", "--advertise-host", "127.0.0.1",
               "--control-port", str(self.control_port), "--peer-port", str(self.peer_port),
               "--front-port", str(self.front_port), "--omp-bind", self.omp_bind,
               "--vllm-log", self.vllm_log_path]
        for k, v in (peer_fronts or {}).items():
            cmd += ["--peer-front", f"{k}={v}"]
        if self.insecure:
            cmd.append("--insecure")
        return cmd + list(self.extra)

    def start(self, peer_fronts: dict[str, str] | None = None) -> None:
        """Launch the subprocess (returns at once; see :meth:`wait_ready`)."""
        Path(self.log_dir).mkdir(parents=True, exist_ok=True)
        env = dict(os.environ)
        env.update(self.env)
        env.update(self.tls_env)
        env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), str(REPO_ROOT / "proto")] +
                                            ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
        log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(self.command(peer_fronts), cwd=str(REPO_ROOT), env=env, stdout=log,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        log.close()

    def wait_ready(self, timeout_s: float = 600.0) -> None:
        """Block until the front answers and gRPC health says SERVING.

        Raises:
            RuntimeError: the agent exited (with its log's tail).
            TimeoutError: not ready in time.
        """
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc is None or self.proc.poll() is not None:
                raise RuntimeError(f"agent {self.agent_id} exited:\n{self.log_tail()}")
            try:
                if httpx.get(self.front_url + "/health", timeout=2.0).status_code == 200:
                    with self.channel() as ch:
                        r = health_pb2_grpc.HealthStub(ch).Check(
                            health_pb2.HealthCheckRequest(service="pallas.v1.Control"), timeout=2.0)
                        if r.status == health_pb2.HealthCheckResponse.SERVING:
                            return
            except (httpx.HTTPError, grpc.RpcError):
                pass
            time.sleep(1.0)
        raise TimeoutError(f"agent {self.agent_id} not ready after {timeout_s} s:\n{self.log_tail()}")

    def control(self, channel: grpc.aio.Channel | grpc.Channel | None = None) -> pallas_pb2_grpc.ControlStub:
        """A Control stub (on ``channel``, or a new synchronous channel)."""
        return pallas_pb2_grpc.ControlStub(channel or self.channel())

    def metrics(self) -> dict[str, float]:
        """This agent's Prometheus samples, ``name{labels}`` -> value."""
        out: dict[str, float] = {}
        for line in httpx.get(self.front_url + "/metrics", timeout=5.0).text.splitlines():
            if line and not line.startswith("#"):
                k, _, v = line.rpartition(" ")
                try:
                    out[k] = float(v)
                except ValueError:
                    pass
        return out

    def log_tail(self, n: int = 60) -> str:
        """The last ``n`` lines of the agent's log."""
        return tail_lines(self.log_path, n)

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM the agent (it stops its vLLM), then SIGKILL its process group if needed."""
        p = self.proc
        if p is None:
            return
        try:
            p.send_signal(signal.SIGTERM)
            p.wait(timeout=timeout_s)
        except (subprocess.TimeoutExpired, ProcessLookupError):
            pass
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            p.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        self.proc = None


def provision_tls(agents: list[LocalAgent], directory: str | Path,
                  xapp_identity: str = XAPP_IDENTITY,
                  aliases: dict[str, list[str]] | None = None) -> TlsFiles:
    """Make a throwaway CA in ``directory`` and give every agent of ``agents`` that is not
    ``insecure`` its certificate (CN and DNS name = its agent id, more DNS names from
    ``aliases[agent_id]``; also ``localhost`` and ``127.0.0.1``) and ``client_tls``, the xApp's
    certificate (CN ``xapp_identity``).

    Returns the xApp's files (for its descriptor's ``controls.tls``). Needs ``cryptography``.
    """
    from pallas_eval.localca import LocalCA

    ca, d = LocalCA("pallas-local-ca"), Path(directory)
    xapp = ca.write(d, xapp_identity)
    for a in agents:
        if not a.insecure:
            names = [a.agent_id, *(aliases or {}).get(a.agent_id, []), "localhost", "127.0.0.1"]
            a.tls, a.client_tls = ca.write(d, a.agent_id, names), xapp
    return xapp


def start_agents(agents: list[LocalAgent], timeout_s: float = 600.0) -> list[LocalAgent]:
    """Start ``agents`` together (each knows the others' fronts) and wait until all are ready.

    Agents without a certificate and not ``insecure`` get one from a new local CA
    (:func:`provision_tls`, files under the first agent's ``log_dir``/tls-<port>).
    On failure every agent is stopped and the error re-raised.
    """
    fronts = {a.agent_id: a.front_url for a in agents}
    need = [a for a in agents if a.tls is None and not a.insecure]
    if need:
        provision_tls(need, Path(agents[0].log_dir) / f"tls-{agents[0].front_port}")
    try:
        for a in agents:
            a.start({k: v for k, v in fronts.items() if k != a.agent_id})
        for a in agents:
            a.wait_ready(timeout_s)
    except BaseException:
        for a in agents:
            a.stop()
        raise
    return agents

"""``pallas-xapp``: the Pallas xApp's entry point, live on a near-RT RIC or in test mode.

Live (what the container runs)::

    CONFIG_FILE=/opt/ric/config/config-file.json pallas-xapp

reads the descriptor's ``controls`` (xapp.config), subscribes to the E2 nodes of the configured
agents through the subscription manager (retried with backoff, kept in step with the descriptor,
deleted on SIGTERM), receives RIC_INDICATION and A1_POLICY_REQ over RMR
(librmr_si.so, as OSC images carry it) and sends trigger/cancel/commit policies to the agents.
The descriptor is re-read when the file's content changes (whatever its times).

Test mode (what ``pallas replay`` runs)::

    pallas-xapp --mode test --config cfg.json --trace drive.e2trace --start-at UNIX_TIME \\
        [--speed 1] [--nrt nrt.json] [--events events.jsonl] [--scheme ctho]

replays the trace's records through the same xApp: the first record is delivered at
``--start-at`` (wall clock; a start later than that catches up at once) or ``--start-delay-s D``
after the xApp is warm (a slow start then shifts the replay), and the others at their recorded
offsets (``--speed 0``: as fast as possible). It exits at the end of the trace plus ``--linger-s`` (policies still in flight finish)
or on SIGTERM/SIGINT. ``--hold-correct-s T --handovers plan.json`` holds back each correct
prediction until T s before its handover (the prediction lead of the stress experiment,
xapp.hold).

Links and state (issue 16), both chosen at start:

- gRPC to the agents: mutual TLS from the descriptor's ``controls.tls`` (certificate, key, CA
  files, re-read when they change). ``--insecure`` is the explicit choice of plaintext (a
  ``tls`` object is then ignored, with a warning). Live mode without ``--insecure`` refuses to
  start unless ``controls.tls`` is present (``enabled: false`` in it is plaintext by choice);
  certificate files it names but that are absent stop the start with a line naming each one
  and how to mount them (the chart OSC's onboarder generates mounts no Secret: docs/osc.md).
  Test mode has no RIC peers; it runs plaintext to the agents (logged) unless ``--tls`` asks
  for ``controls.tls``'s certificates (the replay harness with its local CA does).

Record mode (live): ``--record FILE`` writes every RIC_INDICATION the xApp handles to FILE as
an E2 trace (``xapp.e2.record``: unbuffered whole records, capped at ``--record-max-mb``), for
test mode and ``--history`` on the operator's own network (docs/test-mode.md).
- The durable state (``xapp.store``): ``--store`` (``sdl`` or ``memory``) wins; otherwise live
  mode takes ``controls.sdl.store`` (default ``sdl``: OSC SDL through ``DBAAS_SERVICE_HOST`` /
  ``DBAAS_SERVICE_PORT``; the xApp does not start without it) and test mode uses memory.
  Namespace: ``controls.sdl.namespace`` (default ``pallas``).

Scale-out (docs/scale-out.md): with ``controls.cluster.enabled`` several replicas share the
configured E2 nodes through leases in SDL (``DBAAS_SERVICE_HOST`` / ``_PORT``, in both modes);
each subscribes only to the nodes it owns, naming its own address as the subscriptions'
host (``controls.cluster.endpoint_host``: the Service, ``$POD_IP`` or a template of
``{replica}``; :func:`subscription_host`), and drops the indications of the others. Its
identity: ``--replica-id``, default ``$PALLAS_REPLICA_ID``, ``$POD_NAME`` or ``$HOSTNAME``.

Shape: :func:`main` parses the flags, :func:`build_xapp` composes the parts of the mode (a
:class:`Built`; :class:`StartRefused` carries the one-line reason a run cannot start, exit
status 2), and :data:`RUNS` runs them (:func:`run_test`, :func:`run_live`).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Sequence

import structlog

from xapp.config import ConfigError, XappConfig, load_config_file, load_controls
from xapp.e2.record import DEFAULT_MAX_MB

if TYPE_CHECKING:
    from xapp.a1 import A1PolicyHandler
    from xapp.app import PallasXapp
    from xapp.e2.record import TraceRecorder
    from xapp.e2.trace import TraceRecord
    from xapp.e2.transport import RmrTransport, TraceTransport
    from xapp.events import EventLog
    from xapp.hold import HoldCorrect

log = structlog.get_logger("pallas.xapp.main")

SHUTDOWN_S = 20.0
"""Live mode's default bound on the shutdown, from SIGTERM to the process's end (s): within
Kubernetes' default ``terminationGracePeriodSeconds`` (30 s, then SIGKILL), with room for the
pod's other containers."""


def _configure_logging(level: str) -> None:
    import logging
    logging.basicConfig(level=getattr(logging, level.upper(), logging.INFO), stream=sys.stderr, format="%(message)s")
    structlog.configure(
        processors=[structlog.processors.add_log_level, structlog.processors.TimeStamper(fmt="iso"),
                    structlog.processors.JSONRenderer()],
        wrapper_class=structlog.make_filtering_bound_logger(getattr(logging, level.upper(), logging.INFO)),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="pallas-xapp", description=__doc__.split("\n\n")[0])
    p.add_argument("--mode", choices=["live", "test"], default=os.environ.get("PALLAS_XAPP_MODE", "live"))
    p.add_argument("--config", default=os.environ.get("CONFIG_FILE"), help="the xApp descriptor (CONFIG_FILE)")
    p.add_argument("--trace", help="test mode: the E2 trace to replay")
    p.add_argument("--start-at", type=float, default=0.0, help="test mode: wall time of the first record (0: now)")
    p.add_argument("--start-delay-s", type=float, default=None,
                   help="test mode: instead of --start-at, replay the first record this many seconds after the "
                        "xApp is warm (codecs loaded, telemetry started), however long its start took")
    p.add_argument("--speed", type=float, default=1.0, help="test mode: replay speed (0 = as fast as possible)")
    p.add_argument("--linger-s", type=float, default=3.0, help="test mode: keep running after the trace ends")
    p.add_argument("--nrt", help="neighbour relation table JSON {PCI: NR cell identity}")
    p.add_argument("--events", help="append the decision/event log (JSON lines) here")
    p.add_argument("--scheme", help="override the configured scheme (pallas, ctho, detour, ...)")
    p.add_argument("--hold-correct-s", type=float, default=None,
                   help="test mode: hold back a prediction naming the UE's true next target until this many "
                        "seconds before that handover (the prediction lead T_avail; needs --handovers; xapp.hold)")
    p.add_argument("--handovers", help="test mode, with --hold-correct-s: the replay plan JSON whose 'handovers' "
                                       "list the trace's true handovers (pallas_eval.prepare's plan.json)")
    p.add_argument("--rmr-port", type=int, default=4560)
    p.add_argument("--insecure", action="store_true",
                   help="plaintext gRPC to the agents (tests, the local replay); ignores controls.tls")
    p.add_argument("--tls", action="store_true",
                   help="test mode: mutual TLS to the agents with controls.tls's certificates (test mode is "
                        "plaintext without it; live mode always uses controls.tls unless --insecure)")
    p.add_argument("--record", metavar="FILE",
                   help="live mode: write every E2 indication handled to FILE as an E2 trace (replay it with "
                        "--mode test --trace FILE)")
    p.add_argument("--record-max-mb", type=float, default=DEFAULT_MAX_MB,
                   help="live mode, --record: stop recording (the xApp runs on) before FILE passes this size, MB")
    p.add_argument("--shutdown-s", type=float, default=SHUTDOWN_S,
                   help="live mode: the longest the shutdown after SIGTERM/SIGINT may take, s (default "
                        f"{SHUTDOWN_S:g}, under Kubernetes' 30 s grace period); past it the xApp logs the step "
                        "it was in and exits with status 1")
    p.add_argument("--store", choices=["sdl", "memory"],
                   help="durable state: sdl (DBAAS_SERVICE_HOST/PORT) or memory (default: live "
                        "controls.sdl.store, else sdl; test: memory)")
    p.add_argument("--replica-id", default=None,
                   help="this replica's identity when controls.cluster is enabled (docs/scale-out.md; "
                        "default: $PALLAS_REPLICA_ID, else $POD_NAME, else $HOSTNAME: a StatefulSet's "
                        "per-pod name)")
    p.add_argument("--log-level", default=os.environ.get("PALLAS_LOG_LEVEL", "INFO"))
    return p


def replica_id(flag: str | None) -> str:
    """This replica's identity: ``--replica-id``, else ``$PALLAS_REPLICA_ID``, ``$POD_NAME``,
    ``$HOSTNAME`` (the pod name, which a StatefulSet keeps per replica), else the host name."""
    import socket
    for v in (flag, os.environ.get("PALLAS_REPLICA_ID"), os.environ.get("POD_NAME"),
              os.environ.get("HOSTNAME")):
        if v:
            return v
    return socket.gethostname()


def node_source(config: XappConfig, trace: str | None):
    """Where a replica's shared E2 nodes come from (``controls.cluster.nodes``, docs/scale-out.md
    §2): ``configured``: None (the configuration's ``e2_nodes``); ``ric``: the E2 nodes sending
    indications in ``trace`` (test mode), else the E2 manager's list (live). Raises
    :class:`StartRefused` for a trace that cannot be read."""
    from xapp.cluster.nodes import E2mgrNodes, StaticNodes, trace_nodes
    c = config.cluster
    if c.nodes == "configured":
        return None
    if trace:
        try:
            return StaticNodes(trace_nodes(trace))
        except (OSError, ValueError) as e:
            raise StartRefused(f"controls.cluster.nodes: the trace's E2 nodes: {e}") from None
    try:
        return E2mgrNodes(c.e2mgr_url, timeout_s=c.e2mgr_timeout_s)
    except ValueError as e:
        raise StartRefused(f"controls.cluster.e2mgr_url: {e}") from None


def subscription_host(config: XappConfig, flag: str | None) -> str | None:
    """The ClientEndpoint host of this replica's E2 subscriptions: with ``controls.cluster``
    enabled, :func:`xapp.cluster.endpoint.replica_host` of ``cluster.endpoint_host`` for the
    replica :func:`replica_id` (``$POD_IP`` read from the environment); None when the cluster
    is disabled or the setting is ``service`` (the descriptor's ``client_endpoint.host``).
    Raises :class:`StartRefused` (one line) for a setting that gives no usable host."""
    c = config.cluster
    if not c.enabled or c.endpoint_host == "service":
        return None
    from xapp.cluster.endpoint import EndpointError, replica_host
    try:
        host = replica_host(c.endpoint_host, replica=replica_id(flag), service=config.e2.client_host,
                            environ=os.environ)
    except EndpointError as e:
        raise StartRefused(str(e)) from None
    log.info("subscription_endpoint", host=host, setting=c.endpoint_host)
    return host


def open_cluster(config: XappConfig, flag: str | None, registry=None, trace: str | None = None):
    """The :class:`xapp.cluster.replica.ClusterReplica` of ``controls.cluster`` (None when it
    is disabled): E2 node leases in SDL (DBAAS_SERVICE_HOST / _PORT, namespace
    ``controls.sdl.namespace``) under :func:`replica_id`, over the E2 nodes of
    :func:`node_source` (``trace``: test mode's trace). Raises :class:`StartRefused` (one
    line) for a heartbeat too slow for the lease time, a replica id SDL keys cannot hold,
    SDL not configured or not answering, or a node source that cannot be read."""
    c = config.cluster
    if not c.enabled:
        return None
    bad = c.problems()
    if bad:
        raise StartRefused("; ".join(f"{p}: {m}" for p, m in bad))
    from xapp.cluster.leases import LeaseError, NodeLeases, open_sdl
    from xapp.cluster.replica import ClusterReplica
    from xapp.store import DEFAULT_NAMESPACE
    source = node_source(config, trace)
    rid = replica_id(flag)
    ns = (config.controls.get("sdl") or {}).get("namespace", DEFAULT_NAMESPACE)
    sdl = None
    try:
        sdl = open_sdl()
        if not sdl.is_active():
            raise LeaseError("SDL (DBaaS) does not answer")
        # with a source, the set is read at ClusterReplica.start, before the first heartbeat
        leases = NodeLeases(sdl, rid, config.e2_nodes if source is None else (), namespace=ns, lease_s=c.lease_s,
                            max_claims=c.max_claims, max_releases=c.max_releases,
                            join_delay_s=c.join_delay_s)
    except Exception as e:      # LeaseError; ricsdl: backend unreachable, bad DBAAS_SERVICE_PORT
        if sdl is not None:
            sdl.close()
        what = "" if isinstance(e, LeaseError) else "SDL: "
        raise StartRefused(f"controls.cluster: {what}{e}") from None
    log.info("cluster_replica", replica=rid, namespace=ns, nodes=len(leases.nodes),
             lease_s=c.lease_s, heartbeat_s=c.heartbeat_s)
    return ClusterReplica(leases, heartbeat_s=c.heartbeat_s, registry=registry, nodes=source,
                          refresh_s=c.nodes_refresh_s)


def _with_scheme(cfg, scheme: str | None):
    """``cfg`` with its scheme overridden (``--scheme``). The override goes into ``controls``, so
    it survives what rebuilds the configuration from them (A1 instances, descriptor reloads)."""
    if not scheme:
        return cfg
    return load_controls({**cfg.controls, "scheme": scheme.replace("-", "_")})


def _config(path: str | None, scheme: str | None):
    return _with_scheme(load_config_file(path), scheme)


def _reloaded(doc, app, scheme: str | None, a1=None):
    """The configuration to run after the descriptor changed to ``doc``: the new base (or the
    running one if ``doc`` is invalid, logged field by field), the ``--scheme`` override, then the
    live A1 policy instances re-applied on top (``A1PolicyHandler.rebase``). None if nothing
    changed."""
    from xapp.config import reload_descriptor
    current = app.config if a1 is None else a1.base
    new = reload_descriptor(doc, current)
    if new is current:
        return None
    new = _with_scheme(new, scheme)
    return a1.rebase(new) if a1 is not None else new


def link_security(controls, mode: str, insecure: bool, use_tls: bool = False):
    """The xApp's choice for its gRPC links (module docstring): a
    ``pallas_common.tls.LinkSecurity``. ``use_tls``: test mode's ``--tls``. Raises
    ``pallas_common.tls.TlsError`` (one line: what is missing and how to provide it) when live
    mode (or ``--tls``) has no ``controls.tls``, its certificate files are absent or unusable, or
    both ``--tls`` and ``--insecure`` are given."""
    from pallas_common.tls import LinkSecurity, TlsError
    tls = controls.get("tls")
    if insecure and use_tls:
        raise TlsError("--tls and --insecure: choose one")
    if insecure:
        if tls and tls.get("enabled", True):
            log.warning("tls_ignored", note="--insecure: plaintext gRPC to the agents; controls.tls not used")
        return LinkSecurity(None, insecure=True)
    if mode == "test" and not use_tls:
        log.warning("plaintext", note="test mode: plaintext gRPC to the agents; --tls uses controls.tls's "
                                      "certificates")
        return LinkSecurity(None, insecure=True)
    if tls is None:
        raise TlsError("controls.tls missing: the xApp's certificate, key and CA files (mutual "
                       "TLS to the agents), or --insecure for plaintext")
    if tls.get("enabled", True):
        absent = [f"controls.tls.{k} {tls[k]}" for k in ("cert_file", "key_file", "ca_file")
                  if tls.get(k) and not os.path.exists(tls[k])]
        if absent:
            raise TlsError(f"{', '.join(absent)}: not found; " + _tls_hint(tls, mode))
    return LinkSecurity.from_mapping(tls)


def _tls_hint(tls, mode: str) -> str:
    """How to provide the certificate files ``controls.tls`` names (live: the onboarded chart)."""
    if mode == "test":
        return "give the certificate files controls.tls names, or drop --tls for plaintext"
    where = sorted({os.path.dirname(str(tls.get(k, ""))) for k in ("cert_file", "key_file", "ca_file")})
    return ("the chart OSC's onboarder generates mounts no Secret: create the Secret (tls.crt, tls.key, "
            f"ca.crt) and mount it at {', '.join(where)} with descriptors/xapp-tls-patch.json "
            "(docs/osc.md, 'TLS for the onboarded xApp'), or set controls.tls.enabled to false for "
            "plaintext gRPC to the agents")


def first_trace_record(path: str):
    """The first record of the E2 trace at ``path``, checked before test mode starts. Raises
    ValueError with one line naming the file and the fault: absent or unreadable, not an E2
    trace (a drive-test CSV is named with the command that converts it), or empty."""
    from xapp.e2.trace import TraceFormatError, read_trace
    try:
        first = next(iter(read_trace(path)), None)
    except OSError as e:
        raise ValueError(f"--trace {path}: {e.strerror or e}") from None
    except TraceFormatError as e:
        hint = ""
        if str(path).lower().endswith(".csv"):
            hint = ("; a drive-test CSV becomes a trace with: python -m pallas_tools.convert "
                    f"{path} -o DIR (in the xApp's environment)")
        raise ValueError(f"--trace {path}: {e}{hint}") from None
    if first is None:
        raise ValueError(f"--trace {path}: empty trace (no record)")
    return first


def load_nrt(path: str) -> dict[int, int]:
    """``--nrt``: the neighbour relation table JSON ``{PCI: NR cell identity}``. Raises
    ValueError (one line) for an unreadable file or another shape."""
    try:
        with open(path) as f:
            return {int(k): int(v) for k, v in json.load(f).items()}
    except OSError as e:
        raise ValueError(f"--nrt {path}: {e.strerror or e}") from None
    except (ValueError, TypeError, AttributeError) as e:
        raise ValueError(f"--nrt {path}: not a JSON object of PCI -> NR cell identity ({e})") from None


def _recorder(a):
    """``--record``'s :class:`xapp.e2.record.TraceRecorder` (None without it). Raises ValueError
    (one line) for a cap under 1 KB or when the file cannot be created."""
    if not a.record:
        return None
    if not a.record_max_mb * (1 << 20) >= 1024:
        raise ValueError(f"--record-max-mb {a.record_max_mb}: at least 0.001 (1 KB)")
    from xapp.e2.record import TraceRecorder
    try:
        return TraceRecorder(a.record, int(a.record_max_mb * (1 << 20)))
    except OSError as e:
        raise ValueError(f"--record {a.record}: {e.strerror or e}") from None


def open_xapp_store(controls, mode: str, kind: str | None):
    """The durable state of this run (module docstring): ``xapp.store.open_store`` of the chosen
    kind and namespace. Raises ``xapp.store.StoreUnavailable`` when SDL cannot be reached."""
    from xapp.store import DEFAULT_NAMESPACE, open_store
    sdl = controls.get("sdl") or {}
    if kind is None:
        kind = sdl.get("store", "sdl") if mode != "test" else "memory"
    return open_store(kind, sdl.get("namespace", DEFAULT_NAMESPACE))


class StartRefused(Exception):
    """A run that cannot start: its one-line reason (bad arguments, TLS files, trace, store),
    printed to stderr; the exit status is 2."""


class ReplayStart:
    """Test mode's start on the wall clock: ``start_at`` (Unix s) is when the trace's first
    record (trace time ``first_t``) is delivered; ``offset`` = wall clock minus trace clock.
    :meth:`move` shifts the start (``--start-delay-s``): the clocks below follow."""

    def __init__(self, start_at: float, first_t: float) -> None:
        self.start_at, self.first_t = start_at, first_t
        self._first_read = True

    @property
    def offset(self) -> float:
        return self.start_at - self.first_t

    def move(self, start_at: float) -> None:
        self.start_at = start_at

    def clock(self) -> float:
        """The replay's clock: its first reading is ``start_at``, then the wall clock. The
        replay takes its reference time from its first reading, so record k is delivered at
        start_at + (t_k - t_first) / speed whenever the replay thread starts (a late start
        catches up at once)."""
        if self._first_read:
            self._first_read = False
            return self.start_at
        return time.time()

    def trace_now(self) -> float:
        """The trace clock now."""
        return time.time() - self.offset


@dataclass
class Built:
    """The composed parts of one run (:func:`build_xapp`). ``app``, ``transport``, ``events``
    in both modes; test mode: ``first`` (the trace's first record), ``start``
    (:class:`ReplayStart`), ``hold`` (the ``--hold-correct-s`` predictor, or None); live mode:
    ``a1`` (the A1 policy handler), ``recorder`` (``--record``'s, or None)."""

    mode: str
    config: XappConfig
    app: PallasXapp
    transport: TraceTransport | RmrTransport
    events: EventLog
    first: TraceRecord | None = None
    start: ReplayStart | None = None
    hold: HoldCorrect | None = None
    a1: A1PolicyHandler | None = None
    recorder: TraceRecorder | None = None


def _check_flags(mode: str, a: argparse.Namespace) -> None:
    """Flags that belong to the other mode, or that need a companion (StartRefused)."""
    if mode == "test" and not a.trace:
        raise StartRefused("--mode test needs --trace")
    if a.record and mode != "live":
        raise StartRefused("--record is a live-mode flag (test mode replays a trace)")
    if a.hold_correct_s is not None and (mode != "test" or not a.handovers):
        raise StartRefused("--hold-correct-s is a test-mode knob and needs --handovers")
    if not a.shutdown_s > 0:
        raise StartRefused(f"--shutdown-s {a.shutdown_s}: must be > 0 s")


def build_xapp(config: XappConfig, mode: str, a: argparse.Namespace) -> Built:
    """Compose the xApp of ``mode`` (``live`` or ``test``) for ``config`` and the flags ``a``
    (:func:`build_parser`): the link security, the durable store, the event log, the transport
    of the mode, the replica's part in a scale-out (``controls.cluster``, :func:`open_cluster`)
    and :class:`xapp.app.PallasXapp` over them. Starts nothing but the event log's
    file. Raises :class:`StartRefused` (one line) for flags of the wrong mode, TLS files absent
    or unusable, an unreadable trace, ``--nrt``, ``--record``, ``--handovers`` or
    ``association_map.calibration``, a store
    that cannot be reached, a replica endpoint that cannot be resolved
    (:func:`subscription_host`) or a cluster that cannot be joined."""
    from pallas_common.tls import TlsError
    from xapp.events import EventLog
    from xapp.store import StoreError
    _check_flags(mode, a)
    try:
        if config.calibration_path:    # read again by the predictor; refused here in one line
            from xapp.predict.base import load_calibrators
            load_calibrators(config.calibration_path)
        security = link_security(config.controls, mode, a.insecure, a.tls)
        first = first_trace_record(a.trace) if mode == "test" else None
        nrt = load_nrt(a.nrt) if a.nrt else None
        recorder = _recorder(a)
    except TlsError as e:
        raise StartRefused(f"TLS: {e}") from None
    except ValueError as e:    # --trace, --nrt, --record, the calibration: one line each
        raise StartRefused(str(e)) from None
    try:
        store = open_xapp_store(config.controls, mode, a.store)
    except StoreError as e:
        raise StartRefused(f"store: {e}") from None
    try:
        client_host = subscription_host(config, a.replica_id)
        cluster = open_cluster(config, a.replica_id, None if mode == "test" else _default_registry(),
                               trace=a.trace if mode == "test" else None)
    except StartRefused:
        store.close()
        raise
    events = EventLog(a.events)
    common = dict(nrt=nrt, events=events, store=store, security=security, cluster=cluster)
    if mode == "test":
        assert first is not None
        return _build_test(config, a, first, common)
    return _build_live(config, a, recorder, common, client_host)


def _default_registry():
    from prometheus_client import REGISTRY
    return REGISTRY


def _build_test(cfg: XappConfig, a: argparse.Namespace, first: TraceRecord, common: dict) -> Built:
    """Test mode's parts: the trace replayed by TraceTransport from ``--start-at`` (module
    docstring), the ``--hold-correct-s`` predictor (xapp.hold) when asked."""
    from xapp.app import PallasXapp
    from xapp.e2.transport import TraceTransport
    start = ReplayStart(a.start_at or time.time(), first.time)
    transport = TraceTransport(a.trace, speed=a.speed or None, threaded=True,
                               clock=start.clock if a.speed else time.monotonic)
    hold = None
    if a.hold_correct_s is not None:
        from xapp.hold import HoldCorrect, load_handovers
        try:
            hold = HoldCorrect(PallasXapp._build_predictor(cfg, common["nrt"]), load_handovers(a.handovers),
                               a.hold_correct_s, clock=start.trace_now)
        except (OSError, ValueError) as e:
            raise StartRefused(f"--hold-correct-s: {e}") from None
    app = PallasXapp(cfg, transport, offset=start.offset, predictor=hold, **common)
    return Built("test", cfg, app, transport, common["events"], first=first, start=start, hold=hold)


def _build_live(cfg: XappConfig, a: argparse.Namespace, recorder: TraceRecorder | None, common: dict,
                client_host: str | None = None) -> Built:
    """Live mode's parts: RMR (with ``--record``'s tap), the A1 policy handler, the E2
    subscriptions through submgr (``client_host``: the replica's own ClientEndpoint host,
    :func:`subscription_host`), the metrics on prometheus-client's default registry."""
    from xapp.a1 import A1PolicyHandler, default_policy_type_path, load_policy_type
    from xapp.app import PallasXapp
    from xapp.e2.subscription import SubmgrClient, SubscriptionManager
    from xapp.e2.transport import RmrTransport
    registry = _default_registry()
    transport = RmrTransport(rmr_port=a.rmr_port, use_fake_sdl=bool(os.environ.get("USE_FAKE_SDL")),
                             registry=registry, **dict(cfg.e2.rmr))
    if recorder is not None:
        transport.tap = recorder.on_message
    a1 = A1PolicyHandler(cfg, load_policy_type(default_policy_type_path(cfg.a1.policy_type_id)))
    subscriptions = SubscriptionManager(SubmgrClient(cfg.e2.submgr_url), client_host=client_host)
    app = PallasXapp(cfg, transport, a1=a1, subscriptions=subscriptions, registry=registry, **common)
    return Built("live", cfg, app, transport, common["events"], a1=a1, recorder=recorder)


def run_test(b: Built, a: argparse.Namespace, done: threading.Event) -> int:
    """Replay the trace through the composed xApp (module docstring) until its end plus
    ``--linger-s``, or ``done``; returns 0."""
    from xapp.e2.transport import TraceTransport
    app, events, start, transport = b.app, b.events, b.start, b.transport
    assert start is not None and b.first is not None and isinstance(transport, TraceTransport)
    events.write("start", mode="test", scheme=b.config.scheme, trace=a.trace, start_at=start.start_at,
                 offset=start.offset, hold_correct_s=a.hold_correct_s)
    # Codecs loaded and telemetry flowing while waiting for the start time; then the replay.
    app.warm_up(b.first.payload, b.first.e2_node)
    app.start_telemetry()
    if a.start_delay_s is not None:
        # The start is anchored to the warm xApp, not to the launch: a slow start (a loaded
        # machine) shifts the whole replay instead of making it catch up at once.
        start.move(time.time() + max(0.0, a.start_delay_s))
        app.offset = start.offset      # the replay's and the hold's clocks follow start
        events.write("start_moved", start_at=start.start_at, offset=start.offset)
    late = time.time() - start.start_at
    if late > 0:
        events.write("late_start", late_s=late)
        log.warning("started after the replay's start time; catching up", late_s=round(late, 3))
    while not done.is_set() and time.time() < start.start_at:
        done.wait(min(0.05, max(0.0, start.start_at - time.time())))
    app.start()
    while not done.is_set() and not transport.wait(0.2):
        pass
    end = time.time() + a.linger_s
    while not done.is_set() and time.time() < end:
        done.wait(0.1)
    events.write("end", delivered=transport.delivered, ingest=dict(app.ingest.stats), cycles=app.cycles,
                 predictions_held=getattr(b.hold, "held", 0), **_cluster_end(app))
    app.stop()
    return 0


def _cluster_end(app: Any) -> dict[str, Any]:
    """A replica's part of the ``end`` event (``{}`` without ``controls.cluster``): per E2 node
    the indications it handled and dropped (not owned), its lease counters, the nodes it owns."""
    if app.cluster is None:
        return {}
    from xapp.e2.transport import RIC_INDICATION
    c = app.cluster.leases.counters
    handler = app.handlers.get(RIC_INDICATION)
    return {"cluster": {"admitted": dict(getattr(handler, "admitted", {})),
                        "dropped": dict(app.cluster.dropped), "owned": list(app.cluster.leases.owned()),
                        "claims": c.claims, "releases": c.releases, "losses": c.losses}}


def run_live(b: Built, a: argparse.Namespace, done: threading.Event) -> int:
    """Run on the RIC until SIGTERM/SIGINT (``done``): the HTTP endpoints, the xApp, the
    R-NIB's RAN function versions, A1's resend of every live instance, the descriptor watch;
    at the end the recording is closed and the E2 subscriptions deleted. Returns 0. The
    shutdown ends within ``--shutdown-s`` of the signal: past it, the step in progress is
    logged (``shutdown_overrun``) and the process exits at once with status 1."""
    from xapp.e2.transport import A1_POLICY_QUERY, RmrTransport
    app, transport, a1, recorder = b.app, b.transport, b.a1, b.recorder
    assert a1 is not None and isinstance(transport, RmrTransport)
    started = threading.Event()
    try:
        from xapp.httpd import serve_http
        # ready: started, and the RMR receive loop runs (a round began within 5 s) with SDL up
        serve_http("0.0.0.0", b.config.e2.client_http_port, lambda: started.is_set() and transport.healthy(),
                   on_subscription_response=app.on_subscription_response)
    except OSError as e:
        log.error("http endpoints not served", port=b.config.e2.client_http_port, error=str(e))
    app.start()          # recovers, subscribes (retried with backoff), telemetry, cycle, RMR
    get_nodeb = getattr(getattr(transport, "xapp", None), "GetNodeb", None)
    if get_nodeb is not None:   # the RAN function versions each E2 node declared (R-NIB)
        app.declare_nodebs(get_nodeb)
    started.set()
    transport.send(A1_POLICY_QUERY, a1.query_message())   # A1 resends every live instance
    b.events.write("start", mode="live", scheme=b.config.scheme, record=a.record)
    watcher = _watch_config(a.config, app, a.scheme, done, a1)
    done.wait()

    def close_recording() -> None:
        if recorder is not None:
            recorder.close()
            b.events.write("recorded", path=a.record, records=recorder.count, bytes=recorder.bytes,
                           stopped=recorder.stopped)
    # SIGTERM/SIGINT: the E2 subscriptions are deleted at submgr first (PallasXapp.stop)
    steps = [("recording", close_recording), ("xapp", app.stop),
             ("config watch", lambda: watcher is not None and watcher.join(1.0))]
    since = getattr(done, "at", None) or time.monotonic()
    stuck = shut_down(steps, since + a.shutdown_s, lambda: app.stopping)
    if stuck is not None:
        log.error("shutdown_overrun", step=stuck, deadline_s=a.shutdown_s,
                  note="exiting without the steps left; a stuck part is named in step")
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)      # not sys.exit: the interpreter's exit would wait on the stuck part
    return 0


def shut_down(steps: Sequence[tuple[str, Callable[[], object]]], deadline: float,
              detail: Callable[[], str | None] = lambda: None) -> str | None:
    """Run ``steps`` ((name, callable) pairs) in order on a thread of their own until the
    monotonic time ``deadline`` (s). Returns None when they all ended in time, else the step
    still running, as ``name: part`` when ``detail()`` names a part of it (``part``; None:
    none), whose thread is left behind. A step that raises is logged and the next one runs;
    each step's time is logged (``shutdown_step``, DEBUG)."""
    current: list[str] = []

    def run() -> None:
        for name, step in steps:
            current[:] = [name]
            t0 = time.monotonic()
            try:
                step()
            except Exception as e:
                log.error("shutdown step failed", step=name, error=repr(e))
            log.debug("shutdown_step", step=name, took_s=round(time.monotonic() - t0, 3))
        current.clear()

    th = threading.Thread(target=run, name="xapp-shutdown", daemon=True)
    th.start()
    th.join(max(0.0, deadline - time.monotonic()))
    if not th.is_alive():
        return None
    name = current[0] if current else "?"
    part = detail()
    return f"{name}: {part}" if part else name


RUNS = {"test": run_test, "live": run_live}
"""How each mode runs once built."""


def _stop_on_signals() -> threading.Event:
    """An event set by SIGTERM or SIGINT; its ``at``: the first signal's monotonic time (s)."""
    done = threading.Event()

    def on_signal(signum: int, frame: object) -> None:
        if not done.is_set():
            done.at = time.monotonic()      # type: ignore[attr-defined]  # the shutdown's clock
        done.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    return done


def main(argv: Sequence[str] | None = None) -> int:
    """Run the xApp: parse, build the mode's parts, run them; returns the exit status (2: bad
    configuration or arguments, one line on stderr)."""
    a = build_parser().parse_args(argv)
    _configure_logging(a.log_level)
    done = _stop_on_signals()
    try:
        built = build_xapp(_config(a.config, a.scheme), a.mode, a)
    except (ConfigError, StartRefused) as e:
        print(str(e), file=sys.stderr)
        return 2
    return RUNS[a.mode](built, a, done)


class DescriptorWatch:
    """Tells when the descriptor at ``path`` has new content (Kubernetes ConfigMap reload).

    A mounted ConfigMap is updated by the kubelet swapping a ``..data`` symlink to a new
    directory, and a copied file may keep its modification time, so times and inode numbers say
    nothing reliable: the content decides. :meth:`changed` reads the file (through its
    symlinks) and compares the SHA-256 of its bytes with the last one seen; it returns the new
    bytes when they differ, else None. An unreadable file returns None and is retried next time
    (the swap is atomic, but a half-written copy is not)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.digest = self._digest(self._read())

    def _read(self) -> bytes | None:
        try:
            with open(self.path, "rb") as f:
                return f.read()
        except OSError as e:
            log.error("descriptor unreadable, keeping the running configuration", error=str(e))
            return None

    @staticmethod
    def _digest(data: bytes | None) -> str | None:
        return None if data is None else hashlib.sha256(data).hexdigest()

    def changed(self) -> bytes | None:
        """The file's bytes if its content differs from the last seen, else None."""
        data = self._read()
        digest = self._digest(data)
        if data is None or digest == self.digest:
            return None
        self.digest = digest
        return data


def _watch_config(path: str | None, app, scheme: str | None, done: threading.Event,
                  a1=None, period_s: float = 1.0) -> threading.Thread | None:
    """Re-read the descriptor when CONFIG_FILE's content changes (polled every ``period_s``,
    whatever the file's times: :class:`DescriptorWatch`), as OSC xApps do on inotify, through
    ``xapp.config.reload_descriptor``: an invalid new file is logged field by field and the
    running configuration kept."""
    if not path:
        return None
    watch = DescriptorWatch(path)

    def run() -> None:
        while not done.wait(period_s):
            data = watch.changed()
            if data is None:
                continue
            try:
                doc = json.loads(data)
            except (ValueError, RecursionError) as e:
                log.error("descriptor unreadable, keeping the running configuration", error=str(e))
                continue
            try:
                new = _reloaded(doc, app, scheme, a1)
            except (ConfigError, ValueError) as e:
                log.error("descriptor refused, keeping the running configuration", error=str(e))
                continue
            if new is not None:
                app.reconfigure(new)

    th = threading.Thread(target=run, name="config-watch", daemon=True)
    th.start()
    return th


if __name__ == "__main__":
    sys.exit(main())

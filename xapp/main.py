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
from typing import Sequence

import structlog

from xapp.config import ConfigError, load_config_file, load_controls
from xapp.e2.record import DEFAULT_MAX_MB

log = structlog.get_logger("pallas.xapp.main")


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
    p.add_argument("--store", choices=["sdl", "memory"],
                   help="durable state: sdl (DBAAS_SERVICE_HOST/PORT) or memory (default: live "
                        "controls.sdl.store, else sdl; test: memory)")
    p.add_argument("--log-level", default=os.environ.get("PALLAS_LOG_LEVEL", "INFO"))
    return p


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


def main(argv: Sequence[str] | None = None) -> int:
    """Run the xApp; returns the exit status (2: bad configuration or arguments)."""
    a = build_parser().parse_args(argv)
    _configure_logging(a.log_level)
    try:
        cfg = _config(a.config, a.scheme)
    except ConfigError as e:
        print(str(e), file=sys.stderr)
        return 2
    from pallas_common.tls import TlsError
    from xapp.app import EventLog, PallasXapp
    from xapp.store import StoreError
    if a.mode == "test" and not a.trace:
        print("--mode test needs --trace", file=sys.stderr)
        return 2
    if a.record and a.mode != "live":
        print("--record is a live-mode flag (test mode replays a trace)", file=sys.stderr)
        return 2
    if a.hold_correct_s is not None and (a.mode != "test" or not a.handovers):
        print("--hold-correct-s is a test-mode knob and needs --handovers", file=sys.stderr)
        return 2
    try:
        security = link_security(cfg.controls, a.mode, a.insecure, a.tls)
        first = first_trace_record(a.trace) if a.mode == "test" else None
        nrt = load_nrt(a.nrt) if a.nrt else None
        recorder = _recorder(a)
    except TlsError as e:
        print(f"TLS: {e}", file=sys.stderr)
        return 2
    except ValueError as e:    # --trace, --nrt, --record: one line each
        print(str(e), file=sys.stderr)
        return 2
    try:
        store = open_xapp_store(cfg.controls, a.mode, a.store)
    except StoreError as e:
        print(f"store: {e}", file=sys.stderr)
        return 2
    events = EventLog(a.events)
    done = threading.Event()

    def on_signal(signum, frame):
        done.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    if a.mode == "test":
        from xapp.e2.transport import TraceTransport
        start_at = a.start_at or time.time()
        offset = start_at - first.time
        # Deliver record k at start_at + (t_k - t_first) / speed on the wall clock, whatever the
        # moment the replay thread starts: the replay takes its reference time from the first
        # clock reading, so that reading is the start time (a late start catches up at once).
        first_read = [True]

        def anchored_clock() -> float:
            if first_read[0]:
                first_read[0] = False
                return start_at
            return time.time()

        transport = TraceTransport(a.trace, speed=a.speed or None, threaded=True,
                                   clock=anchored_clock if a.speed else time.monotonic)
        predictor = None
        if a.hold_correct_s is not None:
            from xapp.hold import HoldCorrect, load_handovers
            try:
                predictor = HoldCorrect(PallasXapp._build_predictor(cfg, nrt), load_handovers(a.handovers),
                                        a.hold_correct_s, clock=lambda: time.time() - offset)
            except (OSError, ValueError) as e:
                print(f"--hold-correct-s: {e}", file=sys.stderr)
                return 2
        app = PallasXapp(cfg, transport, nrt=nrt, events=events, offset=offset, store=store,
                         security=security, predictor=predictor)
        events.write("start", mode="test", scheme=cfg.scheme, trace=a.trace, start_at=start_at, offset=offset,
                     hold_correct_s=a.hold_correct_s)
        # Codecs loaded and telemetry flowing while waiting for the start time; then the replay.
        app.warm_up(first.payload, first.e2_node)
        app.start_telemetry()
        if a.start_delay_s is not None:
            # The start is anchored to the warm xApp, not to the launch: a slow start (a loaded
            # machine) shifts the whole replay instead of making it catch up at once.
            start_at = time.time() + max(0.0, a.start_delay_s)
            offset = start_at - first.time      # the closures above read the new values
            app.offset = offset
            events.write("start_moved", start_at=start_at, offset=offset)
        late = time.time() - start_at
        if late > 0:
            events.write("late_start", late_s=late)
            log.warning("started after the replay's start time; catching up", late_s=round(late, 3))
        while not done.is_set() and time.time() < start_at:
            done.wait(min(0.05, max(0.0, start_at - time.time())))
        app.start()
        while not done.is_set() and not transport.wait(0.2):
            pass
        end = time.time() + a.linger_s
        while not done.is_set() and time.time() < end:
            done.wait(0.1)
        events.write("end", delivered=transport.delivered, ingest=dict(app.ingest.stats), cycles=app.cycles,
                     predictions_held=getattr(predictor, "held", 0))
        app.stop()
        return 0

    # live
    from xapp.a1 import A1PolicyHandler, default_policy_type_path, load_policy_type
    from xapp.e2.transport import A1_POLICY_QUERY, RmrTransport
    from prometheus_client import REGISTRY
    transport = RmrTransport(rmr_port=a.rmr_port, use_fake_sdl=bool(os.environ.get("USE_FAKE_SDL")),
                             registry=REGISTRY, **dict(cfg.e2.rmr))
    if recorder is not None:
        transport.tap = recorder.on_message
    a1 = A1PolicyHandler(cfg, load_policy_type(default_policy_type_path(cfg.a1.policy_type_id)))
    from xapp.e2.subscription import SubmgrClient, SubscriptionManager
    subscriptions = SubscriptionManager(SubmgrClient(cfg.e2.submgr_url))
    app = PallasXapp(cfg, transport, nrt=nrt, events=events, a1=a1, subscriptions=subscriptions,
                     store=store, security=security, registry=REGISTRY)
    started = threading.Event()
    try:
        from xapp.httpd import serve_http
        # ready: started, and the RMR receive loop runs (a round began within 5 s) with SDL up
        serve_http("0.0.0.0", cfg.e2.client_http_port, lambda: started.is_set() and transport.healthy(),
                   on_subscription_response=app.on_subscription_response)
    except OSError as e:
        log.error("http endpoints not served", port=cfg.e2.client_http_port, error=str(e))
    app.start()          # recovers, subscribes (retried with backoff), telemetry, cycle, RMR
    get_nodeb = getattr(getattr(transport, "xapp", None), "GetNodeb", None)
    if get_nodeb is not None:   # the RAN function versions each E2 node declared (R-NIB)
        app.declare_nodebs(get_nodeb)
    started.set()
    transport.send(A1_POLICY_QUERY, a1.query_message())   # A1 resends every live instance
    events.write("start", mode="live", scheme=cfg.scheme, record=a.record)
    watcher = _watch_config(a.config, app, a.scheme, done, a1)
    done.wait()
    if recorder is not None:
        recorder.close()
        events.write("recorded", path=a.record, records=recorder.count, bytes=recorder.bytes,
                     stopped=recorder.stopped)
    app.stop()           # SIGTERM/SIGINT: the E2 subscriptions are deleted at submgr first
    if watcher is not None:
        watcher.join(1.0)
    return 0


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

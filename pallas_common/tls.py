"""Mutual TLS and authorisation for every gRPC link (xApp -> agent Control, agent <-> agent
PeerTransfer); issue 16.

Importable from both environments (the agent's modern protobuf, the xApp's protobuf 3.20): it
needs grpcio, structlog and the standard library only.

- :class:`TlsFiles`: where the PEM files are (``PALLAS_TLS_CERT/KEY/CA`` for the agent, the
  descriptor's fields for the xApp); :class:`CertWatcher` holds their current, validated content
  and reloads it when the files change (cert-manager rotates them in place: a Secret volume swaps
  a symlink). A half-written rotation (a key that does not match its certificate, a bad PEM) is
  logged and skipped: the previous material stays in use until the files are whole again.
- :func:`server_credentials`: TLS server credentials that REQUIRE a client certificate signed by
  the CA and re-read the files at handshakes (gRPC's certificate-configuration fetcher), so a
  rotated certificate or CA is served to new connections without a restart.
- :class:`ReloadingChannel` / :class:`ReloadingAioChannel`: a client channel (sync for the xApp,
  grpc.aio for the agents) presenting the client certificate; when the files change it builds
  a new channel under the same object, so stubs made once keep working; the old channel is
  closed after a grace period (its calls in flight finish).
- :func:`peer_identities` / :class:`AuthorizationInterceptor`: the peer's identities (subject CN
  and subject alternative names of its verified certificate, from the gRPC auth context) and a
  grpc.aio server interceptor that admits a call only if one of them is named for the call's
  service (Control: the xApp's identity; PeerTransfer: the directory's agents). Refusals:
  UNAUTHENTICATED (no verified certificate), PERMISSION_DENIED (an identity not named).
- :func:`add_server_port` / :func:`open_channel`: the one place that chooses TLS or plaintext;
  plaintext only with an explicit ``insecure=True``. :class:`LinkSecurity` makes that choice
  once per process (from ``PALLAS_TLS_*`` or given files) and hands out server credentials,
  ports, channel factories and the authorisation interceptor accordingly.

Times are seconds.
"""

from __future__ import annotations

import inspect
import os
import ssl
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import structlog

log = structlog.get_logger("pallas.tls")

__all__ = [
    "ENV_CERT", "ENV_KEY", "ENV_CA", "ANY_IDENTITY", "TlsError", "TlsFiles", "TlsMaterial",
    "CertWatcher", "server_credentials", "channel_credentials", "ReloadingChannel",
    "ReloadingAioChannel", "open_channel", "add_server_port", "peer_identities",
    "AuthorizationInterceptor", "service_of", "LinkSecurity",
]

ENV_CERT, ENV_KEY, ENV_CA = "PALLAS_TLS_CERT", "PALLAS_TLS_KEY", "PALLAS_TLS_CA"
"""Environment variables naming the agent's certificate chain, private key and CA bundle (the
chart's ``tls.*`` values set them from the mounted Secret)."""

ANY_IDENTITY = "*"
"""In an authorisation policy: any peer with a verified certificate from the CA."""

IDENTITY_KEYS = ("x509_common_name", "x509_subject_alternative_name")
"""gRPC auth-context properties holding a verified peer certificate's subject CN and its SANs
(DNS names, URIs such as SPIFFE ids, IP addresses, e-mail addresses)."""


class TlsError(ValueError):
    """TLS configuration or material that cannot be used (missing files, bad PEM, key not matching
    the certificate, neither TLS files nor ``insecure``)."""


@dataclass(frozen=True)
class TlsMaterial:
    """The PEM bytes of one identity: certificate chain (leaf first), private key, CA bundle."""

    cert_chain: bytes
    key: bytes
    ca: bytes


def _validate(m: TlsMaterial) -> None:
    """Raise TlsError unless the key matches the leaf certificate and every PEM parses.

    Uses the standard library's ``ssl`` (OpenSSL): the same checks a TLS stack does at load time.
    """
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    try:
        ctx.load_verify_locations(cadata=m.ca.decode("ascii"))
    except (ssl.SSLError, UnicodeDecodeError, ValueError) as exc:
        raise TlsError(f"CA bundle is not valid PEM: {exc}") from None
    with tempfile.TemporaryDirectory(prefix="pallas-tls-") as d:
        cert, key = Path(d, "cert.pem"), Path(d, "key.pem")
        key.touch(mode=0o600)
        key.write_bytes(m.key)
        cert.write_bytes(m.cert_chain)
        try:
            ctx.load_cert_chain(cert, key)
        except ssl.SSLError as exc:
            raise TlsError(f"certificate chain and key do not load together: {exc}") from None


@dataclass(frozen=True)
class TlsFiles:
    """Paths of the PEM files of one identity.

    ``cert``: certificate chain (leaf first) presented to peers; ``key``: its private key;
    ``ca``: the CA bundle that peers' certificates must chain to.
    """

    cert: Path
    key: Path
    ca: Path

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> "TlsFiles | None":
        """The files named by ``PALLAS_TLS_CERT``, ``PALLAS_TLS_KEY``, ``PALLAS_TLS_CA``.

        Returns None when none is set (the caller then needs ``insecure``). Raises TlsError when
        only some are set (naming the missing ones): a half-configured TLS never falls back to
        plaintext.
        """
        env = os.environ if environ is None else environ
        vals = {k: env.get(k, "").strip() for k in (ENV_CERT, ENV_KEY, ENV_CA)}
        if not any(vals.values()):
            return None
        missing = [k for k, v in vals.items() if not v]
        if missing:
            raise TlsError(f"TLS half configured: {', '.join(missing)} not set")
        return cls(Path(vals[ENV_CERT]), Path(vals[ENV_KEY]), Path(vals[ENV_CA]))

    def read(self) -> TlsMaterial:
        """Read and validate the three files. Raises TlsError (naming the file) if one cannot be
        read, and as :func:`_validate` does."""
        m = self.read_unchecked()
        _validate(m)
        return m

    def read_unchecked(self) -> TlsMaterial:
        """Read the three files as they are. Raises TlsError (naming the file) if one cannot
        be read."""
        data = []
        for name in ("cert", "key", "ca"):
            p = getattr(self, name)
            try:
                data.append(Path(p).read_bytes())
            except OSError as exc:
                raise TlsError(f"TLS {name} file {p}: {exc.strerror or exc}") from None
        return TlsMaterial(*data)


class CertWatcher:
    """The current material of ``files``, reloaded when the files change.

    The files are read at construction (raises TlsError if they cannot be used: a server never
    starts without its certificate). :meth:`poll` re-reads them at most every
    ``check_interval_s`` (0: at every call) and, if their bytes changed and the new material is
    valid, makes it current and increments :attr:`generation`. Invalid new material is logged and
    skipped (tried again at the next poll). Thread-safe: gRPC calls the server's fetcher from its
    own threads.
    """

    def __init__(self, files: TlsFiles, *, check_interval_s: float = 5.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.files = files
        self.check_interval_s = float(check_interval_s)
        self._clock = clock
        self._lock = threading.Lock()
        self._material = files.read()
        self._checked = clock()
        self.generation = 0
        self.failed_reloads = 0

    @property
    def material(self) -> TlsMaterial:
        """The material in use (as of the last poll)."""
        return self._material

    def poll(self) -> bool:
        """Re-read the files if the check interval has passed; True if new material is now
        current."""
        with self._lock:
            now = self._clock()
            if now - self._checked < self.check_interval_s:
                return False
            self._checked = now
            try:
                m = self.files.read_unchecked()
                if m == self._material:
                    return False
                _validate(m)  # only what changed (the check writes temporary files)
            except TlsError as exc:
                self.failed_reloads += 1
                log.warning("tls_reload_skipped", cert=str(self.files.cert), error=str(exc))
                return False
            self._material = m
            self.generation += 1
            log.info("tls_reloaded", cert=str(self.files.cert), generation=self.generation)
            return True


def _server_config(m: TlsMaterial) -> grpc.ServerCertificateConfiguration:
    return grpc.ssl_server_certificate_configuration([(m.key, m.cert_chain)],
                                                     root_certificates=m.ca)


def server_credentials(watcher: CertWatcher) -> grpc.ServerCredentials:
    """TLS server credentials from ``watcher`` that require a client certificate chaining to the
    CA bundle, reloaded on change.

    gRPC asks the fetcher for a new configuration when a connection's handshake starts; it polls
    ``watcher`` and hands over new material once. Connections already open keep their session.
    """
    seen = [watcher.generation]

    def fetch() -> grpc.ServerCertificateConfiguration | None:
        try:
            watcher.poll()
            if watcher.generation == seen[0]:
                return None
            seen[0] = watcher.generation
            return _server_config(watcher.material)
        except Exception as exc:  # never let a reload failure break handshakes
            log.error("tls_fetch_failed", error=repr(exc))
            return None

    return grpc.dynamic_ssl_server_credentials(_server_config(watcher.material), fetch,
                                               require_client_authentication=True)


def channel_credentials(m: TlsMaterial) -> grpc.ChannelCredentials:
    """Client TLS credentials: verify the server against ``m.ca``, present ``m.cert_chain``."""
    return grpc.ssl_channel_credentials(root_certificates=m.ca, private_key=m.key,
                                        certificate_chain=m.cert_chain)


class _LazyMultiCallable:
    """A multi-callable that resolves to the owner's current channel at each call."""

    def __init__(self, owner: "_Reloading", kind: str, args: tuple, kwargs: dict) -> None:
        self._owner, self._kind, self._args, self._kwargs = owner, kind, args, kwargs
        self._gen = -1
        self._target: Any = None

    def _current(self) -> Any:
        ch, gen = self._owner._current()
        if gen != self._gen:
            self._target = getattr(ch, self._kind)(*self._args, **self._kwargs)
            self._gen = gen
        return self._target

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._current()(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:  # with_call, future (sync multi-callables)
        return getattr(self._current(), name)


class _Reloading:
    """Shared part of the reloading channels: the current channel and its generation."""

    _aio = False

    def __init__(self, address: str, watcher: CertWatcher, *, options: Sequence[tuple] = (),
                 server_name: str | None = None, grace_s: float = 60.0) -> None:
        self.address = address
        self.watcher = watcher
        self.grace_s = float(grace_s)
        self._options = list(options)
        if server_name:
            self._options.append(("grpc.ssl_target_name_override", server_name))
        self._lock = threading.Lock()
        self._gen = watcher.generation
        self._channel = self._build(watcher.material)
        self.rebuilds = 0

    def _build(self, m: TlsMaterial) -> Any:
        mod = grpc.aio if self._aio else grpc
        return mod.secure_channel(self.address, channel_credentials(m), options=self._options)

    def _current(self) -> tuple[Any, int]:
        self.watcher.poll()
        with self._lock:
            if self.watcher.generation != self._gen:
                old = self._channel
                self._channel = self._build(self.watcher.material)
                self._gen = self.watcher.generation
                self.rebuilds += 1
                self._retire(old)
            return self._channel, self._gen

    def _retire(self, old: Any) -> None:
        raise NotImplementedError

    def unary_unary(self, *args: Any, **kwargs: Any) -> _LazyMultiCallable:
        return _LazyMultiCallable(self, "unary_unary", args, kwargs)

    def unary_stream(self, *args: Any, **kwargs: Any) -> _LazyMultiCallable:
        return _LazyMultiCallable(self, "unary_stream", args, kwargs)

    def stream_unary(self, *args: Any, **kwargs: Any) -> _LazyMultiCallable:
        return _LazyMultiCallable(self, "stream_unary", args, kwargs)

    def stream_stream(self, *args: Any, **kwargs: Any) -> _LazyMultiCallable:
        return _LazyMultiCallable(self, "stream_stream", args, kwargs)


class ReloadingChannel(_Reloading):
    """A sync gRPC channel to ``address`` with the client certificate of ``watcher``, rebuilt
    when the files change (checked at each call, at most every ``watcher.check_interval_s``).

    Use it as a ``grpc.Channel`` (stubs, ``close``, context manager). ``server_name`` overrides
    the name the server's certificate is checked against (when ``address`` is an IP address
    not in the certificate). A replaced channel is closed ``grace_s`` later.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._timers: list[tuple[threading.Timer, Any]] = []

    def _retire(self, old: Any) -> None:
        t = threading.Timer(self.grace_s, old.close)
        t.daemon = True
        t.start()
        self._timers.append((t, old))

    def subscribe(self, callback: Callable, try_to_connect: bool = False) -> None:
        self._current()[0].subscribe(callback, try_to_connect)

    def unsubscribe(self, callback: Callable) -> None:
        self._channel.unsubscribe(callback)

    def close(self) -> None:
        """Close the current channel and every replaced one now."""
        with self._lock:
            for t, old in self._timers:
                t.cancel()
                old.close()
            self._timers.clear()
            self._channel.close()

    def __enter__(self) -> "ReloadingChannel":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class ReloadingAioChannel(_Reloading):
    """The grpc.aio twin of :class:`ReloadingChannel` (for the agents' PeerTransfer clients).

    Create and use it inside a running event loop. A replaced channel is closed with
    ``close(grace=grace_s)`` (calls in flight get that long to finish).
    """

    _aio = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._closing: set = set()

    def _retire(self, old: Any) -> None:
        import asyncio

        task = asyncio.get_running_loop().create_task(old.close(grace=self.grace_s))
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def close(self, grace: float | None = None) -> None:
        """Close the current channel (``grace`` as grpc.aio's) and every replaced one."""
        import asyncio

        await self._channel.close(grace)
        if self._closing:
            for t in list(self._closing):
                t.cancel()
            await asyncio.gather(*self._closing, return_exceptions=True)

    def get_state(self, try_to_connect: bool = False) -> grpc.ChannelConnectivity:
        return self._current()[0].get_state(try_to_connect)

    async def wait_for_state_change(self, last_observed_state: grpc.ChannelConnectivity) -> None:
        await self._channel.wait_for_state_change(last_observed_state)

    async def channel_ready(self) -> None:
        await self._current()[0].channel_ready()

    async def __aenter__(self) -> "ReloadingAioChannel":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close(None)


def _check_choice(tls: CertWatcher | None, insecure: bool) -> None:
    if tls is not None and insecure:
        raise TlsError("both TLS files and insecure given: choose one")
    if tls is None and not insecure:
        raise TlsError("no TLS files configured (PALLAS_TLS_CERT/KEY/CA or the descriptor's TLS "
                       "fields); plaintext needs an explicit insecure=True (--insecure)")


def open_channel(address: str, tls: CertWatcher | None, *, insecure: bool = False,
                 aio: bool = False, options: Sequence[tuple] = (),
                 server_name: str | None = None) -> Any:
    """A client channel to ``address``: mutual TLS with ``tls`` (a reloading channel), or
    plaintext only when ``tls`` is None and ``insecure`` is True. ``aio`` picks grpc.aio.

    Raises TlsError for neither or both.
    """
    _check_choice(tls, insecure)
    if tls is None:
        return (grpc.aio if aio else grpc).insecure_channel(address, options=list(options))
    cls = ReloadingAioChannel if aio else ReloadingChannel
    return cls(address, tls, options=options, server_name=server_name)


def add_server_port(server: Any, address: str, tls: CertWatcher | None, *,
                    insecure: bool = False) -> int:
    """Bind ``server`` (grpc or grpc.aio) to ``address``: mutual TLS with ``tls`` (client
    certificates required, reloaded on change), or plaintext only when ``tls`` is None and
    ``insecure`` is True. Returns the bound port. Raises TlsError for neither or both."""
    _check_choice(tls, insecure)
    if tls is None:
        return server.add_insecure_port(address)
    return server.add_secure_port(address, server_credentials(tls))


def peer_identities(auth_context: Mapping[str, Iterable[bytes]]) -> frozenset[str]:
    """The identities of a call's peer: its verified certificate's subject CN and every subject
    alternative name, from a gRPC auth context (``context.auth_context()``). Empty for a
    plaintext call or one without a client certificate."""
    out: set[str] = set()
    for k in IDENTITY_KEYS:
        for v in auth_context.get(k, ()):
            out.add(v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v))
    return frozenset(out)


def service_of(method: str) -> str:
    """``/pallas.v1.Control/Trigger`` -> ``pallas.v1.Control``."""
    return method.lstrip("/").split("/", 1)[0]


_BEHAVIOURS = ("unary_unary", "unary_stream", "stream_unary", "stream_stream")


class AuthorizationInterceptor(grpc.aio.ServerInterceptor):
    """Admit a call only if its peer's certificate names an identity allowed for its service.

    ``policy``: full service name (``pallas.v1.Control``) -> identities (CN or SAN values; ``*``:
    any peer with a verified certificate). A service missing from the policy is refused to
    everyone (fail closed). :meth:`allow` replaces a service's identities at run time (the
    directory changed). The check runs before the handler sees the request: a refused call gets
    UNAUTHENTICATED (no verified peer certificate) or PERMISSION_DENIED and never reaches the
    servicer. Handlers must be ``async`` (grpc.aio servicers); :attr:`refused` counts refusals
    per (service, code name).
    """

    def __init__(self, policy: Mapping[str, Iterable[str]]) -> None:
        self._policy: dict[str, frozenset[str]] = {s: frozenset(ids) for s, ids in policy.items()}
        self.refused: dict[tuple[str, str], int] = {}

    def allow(self, service: str, identities: Iterable[str]) -> None:
        """Set the identities allowed to call ``service`` (replacing the previous set)."""
        self._policy[service] = frozenset(identities)

    def allowed(self, service: str) -> frozenset[str]:
        """The identities allowed to call ``service`` (empty: nobody)."""
        return self._policy.get(service, frozenset())

    async def _admit(self, method: str, context: grpc.aio.ServicerContext) -> None:
        service = service_of(method)
        ids = peer_identities(context.auth_context())
        if not ids:
            code, why = grpc.StatusCode.UNAUTHENTICATED, "no verified client certificate"
        else:
            allowed = self.allowed(service)
            if ANY_IDENTITY in allowed or ids & allowed:
                return
            code, why = grpc.StatusCode.PERMISSION_DENIED, \
                f"identity {sorted(ids)} may not call {service}"
        key = (service, code.name)
        self.refused[key] = self.refused.get(key, 0) + 1
        log.warning("grpc_call_refused", method=method, peer=context.peer(), code=code.name,
                    identities=sorted(ids))
        await context.abort(code, why)

    def _guard(self, method: str, kind: str, behaviour: Callable) -> Callable:
        admit = self._admit
        if inspect.isasyncgenfunction(behaviour):
            async def guarded_stream(request: Any, context: Any) -> Any:
                await admit(method, context)
                async for item in behaviour(request, context):
                    yield item
            return guarded_stream

        async def guarded(request: Any, context: Any) -> Any:
            await admit(method, context)
            out = behaviour(request, context)
            return await out if inspect.isawaitable(out) else out
        return guarded

    async def intercept_service(self, continuation: Callable, handler_call_details: Any) -> Any:
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        method = handler_call_details.method
        repl = {k: self._guard(method, k, getattr(handler, k)) for k in _BEHAVIOURS
                if getattr(handler, k) is not None}
        return handler._replace(**repl)


class LinkSecurity:
    """One process's choice for its gRPC links, made once: mutual TLS from ``files`` (one
    :class:`CertWatcher` shared by its servers and channels), or plaintext with ``insecure``.

    Args:
        files: the process's certificate, key and CA (None: plaintext, needs ``insecure``).
        insecure: plaintext on every link (tests, the local replay); TlsError with ``files``.
        check_interval_s: how often the files are re-read (:class:`CertWatcher`).
        server_name: name the peers' server certificates are checked against instead of the
            dialled host (None: the host of each address).

    Raises TlsError for neither or both, or unusable files.
    """

    def __init__(self, files: TlsFiles | None, *, insecure: bool = False,
                 check_interval_s: float = 5.0, server_name: str | None = None) -> None:
        if files is not None and insecure:
            raise TlsError("both TLS files and insecure given: choose one")
        self.watcher = (CertWatcher(files, check_interval_s=check_interval_s)
                        if files is not None else None)
        _check_choice(self.watcher, insecure)
        self.insecure = insecure
        self.server_name = server_name

    @classmethod
    def from_env(cls, *, insecure: bool = False, environ: Mapping[str, str] | None = None,
                 **kwargs: Any) -> "LinkSecurity":
        """From ``PALLAS_TLS_CERT/KEY/CA`` (:meth:`TlsFiles.from_env`); ``insecure`` only when
        none is set (the agent's ``--insecure``)."""
        return cls(TlsFiles.from_env(environ), insecure=insecure, **kwargs)

    @classmethod
    def from_mapping(cls, tls: Mapping[str, Any] | None, *,
                     insecure: bool = False) -> "LinkSecurity":
        """From the xApp descriptor's ``controls.tls`` object: ``enabled`` (default true),
        ``cert_file``, ``key_file``, ``ca_file``, optional ``check_interval_s`` and
        ``server_name``. ``enabled: false`` is an explicit choice of plaintext, as is
        ``insecure`` (the command line's ``--insecure``) when the object is absent or disabled.
        Raises TlsError for missing file fields, unusable files, or files with ``insecure``."""
        tls = dict(tls or {})
        if not tls or not tls.get("enabled", True):
            return cls(None, insecure=insecure or bool(tls))
        missing = [k for k in ("cert_file", "key_file", "ca_file") if not tls.get(k)]
        if missing:
            raise TlsError(f"controls.tls: {', '.join(missing)} missing")
        files = TlsFiles(Path(tls["cert_file"]), Path(tls["key_file"]), Path(tls["ca_file"]))
        return cls(files, insecure=insecure,
                   check_interval_s=float(tls.get("check_interval_s", 5.0)),
                   server_name=tls.get("server_name") or None)

    def server_credentials(self) -> grpc.ServerCredentials | None:
        """:func:`server_credentials` of the watcher; None when plaintext."""
        return None if self.watcher is None else server_credentials(self.watcher)

    def add_port(self, server: Any, address: str) -> int:
        """:func:`add_server_port` with this choice; returns the bound port."""
        return add_server_port(server, address, self.watcher, insecure=self.insecure)

    def interceptors(self, policy: Mapping[str, Iterable[str]]) -> list[AuthorizationInterceptor]:
        """``[AuthorizationInterceptor(policy)]`` with TLS; ``[]`` when plaintext (there is no
        peer identity to check; every call would be refused)."""
        return [] if self.watcher is None else [AuthorizationInterceptor(policy)]

    def channel(self, address: str, options: Sequence[tuple] = ()) -> Any:
        """A sync channel to ``address`` (the xApp's PolicyClient/TelemetryConsumer
        ``channel_factory``)."""
        return open_channel(address, self.watcher, insecure=self.insecure, options=options,
                            server_name=self.server_name)

    def aio_channel(self, address: str, options: Sequence[tuple] = ()) -> Any:
        """A grpc.aio channel to ``address`` (agent.transfer's PeerClient/PeerPool
        ``channel_factory``)."""
        return open_channel(address, self.watcher, insecure=self.insecure, aio=True,
                            options=options, server_name=self.server_name)

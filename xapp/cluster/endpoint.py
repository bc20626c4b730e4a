"""The host a replica names in its E2 subscriptions (``controls.cluster.endpoint_host``;
docs/scale-out.md §6), so that the subscription manager and the routing manager route each
replica's subscriptions to that replica and not to a Service shared by all of them.

What OSC's subscription manager does with ``SubscriptionParams.ClientEndpoint``
({Host, HTTPPort, RMRPort}; ric-plt-submgr ``ConstructEndpointAddresses``): it refuses an
empty Host; the HTTP endpoint its notifications go to is ``Host:HTTPPort``; the RMR endpoint
the routing manager routes the subscription's indications to (``mse|12050|<subid>|host:port``)
is Host with every ``http`` replaced by ``rmr``, then ``:RMRPort`` (so the OSC chart's
``service-ricxapp-<name>-http`` Service becomes its ``...-rmr`` twin). A per-replica Host
must therefore be one name at which the pod answers both ports, and must not contain
``http``: the rewrite would name another host, which a pod's DNS name or IP does not have.
Host and port are joined with ``:`` without brackets, so an IPv6 address cannot be named.

Settings (:func:`replica_host`):

- ``service``: the descriptor's ``controls.e2.client_endpoint.host`` as it is (one name for
  every replica; the single-replica behaviour, and the default);
- ``pod_ip``: ``$POD_IP`` (the downward API's ``status.podIP``), an IPv4 address;
- a template of the fields ``{replica}`` (this replica's id: ``--replica-id`` / ``$POD_NAME``)
  and ``{service}`` (``client_endpoint.host``), e.g. ``{replica}.pallas-xapp.ricxapp`` for a
  StatefulSet pod under the headless Service ``pallas-xapp`` of namespace ``ricxapp``. The
  result must be a host name of RFC 1123 section 2.1 (labels of 1-63 letters, digits or
  ``-``, neither first nor last ``-``; 253 characters at most).
"""

from __future__ import annotations

import ipaddress
import re
import string
from collections.abc import Mapping

__all__ = ["EndpointError", "FIELDS", "replica_host", "is_host_name"]

FIELDS = ("replica", "service")
"""The fields a template may name."""

_LABEL = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?$")


class EndpointError(ValueError):
    """``endpoint_host`` cannot give this replica a host; the message is one line naming the
    setting and what is wrong."""


def is_host_name(name: str) -> bool:
    """Whether ``name`` is a host name of RFC 1123 section 2.1 (dot-separated labels of 1-63
    letters, digits and ``-``, not beginning or ending with ``-``; at most 253 characters; one
    trailing dot, the root, not allowed)."""
    return 0 < len(name) <= 253 and all(_LABEL.match(label) for label in name.split("."))


def _template(setting: str, replica: str, service: str) -> str:
    try:
        parts = list(string.Formatter().parse(setting))
    except ValueError as e:
        raise EndpointError(f"controls.cluster.endpoint_host {setting!r}: not a template ({e})") from None
    for _, name, spec, conv in parts:
        if name is None:
            continue
        if name not in FIELDS:
            raise EndpointError(f"controls.cluster.endpoint_host {setting!r}: unknown field "
                                f"{{{name}}} (known: {', '.join('{' + f + '}' for f in FIELDS)})")
        if spec or conv:
            raise EndpointError(f"controls.cluster.endpoint_host {setting!r}: {{{name}}} takes no "
                                "conversion or format")
    return setting.format(replica=replica, service=service)


def replica_host(setting: str, *, replica: str, service: str, environ: Mapping[str, str]) -> str:
    """The ClientEndpoint Host of this replica's subscriptions.

    ``setting``: ``controls.cluster.endpoint_host`` (module docstring); ``replica``: the
    replica id; ``service``: ``controls.e2.client_endpoint.host``; ``environ``: the process
    environment (``POD_IP``). Returns ``service`` unchanged for ``service``. Raises
    :class:`EndpointError` (one line) for ``pod_ip`` with ``POD_IP`` unset or not an IPv4
    address, a template naming an unknown field, and a result that is no RFC 1123 host name
    or contains ``http`` (submgr would route RMR to another name).
    """
    if setting == "service":
        return service
    if setting == "pod_ip":
        raw = (environ.get("POD_IP") or "").strip()
        if not raw:
            raise EndpointError("controls.cluster.endpoint_host pod_ip: POD_IP is not set (give the pod "
                                "env POD_IP from the downward API, fieldRef status.podIP)")
        try:
            ip = ipaddress.ip_address(raw)
        except ValueError:
            raise EndpointError(f"controls.cluster.endpoint_host pod_ip: POD_IP {raw!r} is not an IP "
                                "address") from None
        if ip.version != 4:
            raise EndpointError(f"controls.cluster.endpoint_host pod_ip: POD_IP {raw} is IPv6; submgr joins "
                                "host and port with ':' (use a DNS name template)")
        return str(ip)
    host = _template(setting, replica, service)
    if not is_host_name(host):
        raise EndpointError(f"controls.cluster.endpoint_host {setting!r}: {host!r} is not an RFC 1123 "
                            "host name (labels of 1-63 letters, digits or '-', 253 characters at most)")
    if "http" in host:
        raise EndpointError(f"controls.cluster.endpoint_host {setting!r}: {host!r} contains 'http', which "
                            "submgr rewrites to 'rmr' for the RMR route (another host)")
    return host

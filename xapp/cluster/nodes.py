"""The E2 nodes the replicas of a scale-out share: the nodes the RIC actually has (issue 46,
docs/scale-out.md §2).

The replicas partition a set of E2 node names by rendezvous hashing; an indication is admitted
by its RMR MEID (``RmrMessage.e2_node``) and a session record is written for the MEID of the
UE's latest report. So the shared set must be spelled as the MEIDs are: the names of the E2
nodes that send indications, not the agents' ``e2_node_id`` (an agent's edge server serves
cells of several E2 nodes, and a node may have no agent of its own). Where they come from:

- **test mode**: the trace's E2 nodes, every MEID of a RIC_INDICATION in the replayed trace
  (:func:`trace_nodes`), known before the replay starts;
- **live**: the E2 manager's list of E2 nodes (OSC e2mgr's REST ``GET /v1/nodeb/states``: a
  JSON array of ``{"inventoryName", "globalNbId", "connectionStatus"}``, the inventory name
  being the node's RMR MEID), those whose ``connectionStatus`` is ``CONNECTED`` or absent
  (:class:`E2mgrNodes`, :func:`parse_nodeb_states`), read again every
  ``controls.cluster.nodes_refresh_s`` by :class:`xapp.cluster.replica.ClusterReplica` off the
  RMR thread;
- ``controls.cluster.nodes: "configured"``: the agents' E2 nodes (``XappConfig.e2_nodes``), the
  set the xApp used before (:class:`StaticNodes`).

Every name passes :func:`normalise_node` (surrounding blanks stripped; 1-150 letters, digits or
``._:-``, the characters of an E2 inventory name and of an SDL key the lease patterns cannot
read as a glob); others are left out and counted.
"""

from __future__ import annotations

import json
import re
import urllib.request
from collections.abc import Iterable
from pathlib import Path
from typing import Protocol

import structlog

log = structlog.get_logger("pallas.xapp.cluster")

__all__ = ["NodeSource", "StaticNodes", "E2mgrNodes", "normalise_node", "normalise_nodes",
           "parse_nodeb_states", "trace_nodes", "DEFAULT_E2MGR_URL", "MAX_STATES_BYTES"]

DEFAULT_E2MGR_URL = "http://service-ricplt-e2mgr-http.ricplt:3800/v1/nodeb/states"
"""OSC e2mgr's REST list of E2 nodes, at the service name of the RIC platform's Helm charts
(namespace ``ricplt``, HTTP port 3800)."""

MAX_STATES_BYTES = 4 << 20
"""The largest e2mgr answer read (octets; an entry is about 150, so some 25,000 E2 nodes); a
longer one is refused, the set kept as it was."""

_NODE = re.compile(r"^[A-Za-z0-9._:-]{1,150}$")
RIC_INDICATION = 12050


def normalise_node(name: object) -> str | None:
    """``name`` as a shared E2 node name (blanks around it stripped), or None when it is not a
    string of 1-150 letters, digits or ``._:-`` (module docstring)."""
    if not isinstance(name, str):
        return None
    s = name.strip()
    return s if _NODE.match(s) else None


def normalise_nodes(names: Iterable[object]) -> tuple[tuple[str, ...], int]:
    """(the valid names of ``names``, normalised, each once, sorted; how many were left out)."""
    good, bad = set(), 0
    for n in names:
        s = normalise_node(n)
        if s is None:
            bad += 1
        else:
            good.add(s)
    return tuple(sorted(good)), bad


def parse_nodeb_states(body: bytes | str) -> tuple[tuple[str, ...], int]:
    """The E2 nodes of an e2mgr ``GET /v1/nodeb/states`` answer (a JSON array of objects with
    ``inventoryName`` and, in later releases, ``connectionStatus``): (the inventory names of the
    entries CONNECTED or without a status, normalised, sorted; entries left out for a bad
    name). Entries of another status (DISCONNECTED, SHUTTING_DOWN, ...) are not counted as
    left out. Raises ValueError when the body is not such an array."""
    doc = json.loads(body)
    if not isinstance(doc, list):
        raise ValueError(f"e2mgr nodeb states: a JSON array expected, got {type(doc).__name__}")
    names: list[object] = []
    for e in doc:
        if not isinstance(e, dict):
            raise ValueError(f"e2mgr nodeb states: an entry is a {type(e).__name__}, not an object")
        status = e.get("connectionStatus")
        if status is None or status == "CONNECTED":
            names.append(e.get("inventoryName"))
    return normalise_nodes(names)


def trace_nodes(path: str | Path) -> tuple[str, ...]:
    """The E2 nodes that send indications in the trace at ``path`` (the MEIDs of its
    RIC_INDICATION records, normalised, sorted). Raises OSError / ``TraceFormatError`` as
    :func:`xapp.e2.trace.read_trace` does."""
    from xapp.e2.trace import read_trace
    nodes, bad = normalise_nodes({r.e2_node for r in read_trace(path) if r.mtype == RIC_INDICATION
                                  and r.e2_node})
    if bad:
        log.warning("trace_nodes_left_out", trace=str(path), count=bad)
    return nodes


class NodeSource(Protocol):
    """Where a replica's shared E2 node set comes from: ``nodes()`` -> the set now (sorted
    names), or None when it is not known now (the caller keeps the set it had). May block up
    to the source's timeout; never called on the RMR thread."""

    def nodes(self) -> tuple[str, ...] | None: ...


class StaticNodes:
    """A fixed set (the trace's, the configured agents', a test's), normalised."""

    def __init__(self, names: Iterable[object]) -> None:
        self._nodes, self.left_out = normalise_nodes(names)

    def nodes(self) -> tuple[str, ...]:
        return self._nodes


class E2mgrNodes:
    """The E2 manager's list of E2 nodes (:func:`parse_nodeb_states`) over HTTP.

    Args:
        url: e2mgr's ``/v1/nodeb/states`` (``controls.cluster.e2mgr_url``).
        timeout_s: connect and read timeout of one request (s).
        max_bytes: the largest answer read (:data:`MAX_STATES_BYTES`).

    :meth:`nodes` returns None (and logs) when e2mgr does not answer, answers other than 200,
    too long or malformed; ``failures`` counts those answers, ``left_out`` the names refused in
    the last good one."""

    def __init__(self, url: str = DEFAULT_E2MGR_URL, *, timeout_s: float = 2.0,
                 max_bytes: int = MAX_STATES_BYTES) -> None:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"e2mgr url {url!r}: http:// or https:// expected")
        if not timeout_s > 0 or max_bytes < 2:
            raise ValueError(f"e2mgr timeout_s {timeout_s} / max_bytes {max_bytes}: must be > 0 / >= 2")
        self.url, self.timeout_s, self.max_bytes = url, float(timeout_s), int(max_bytes)
        self.failures = 0
        self.left_out = 0

    def fetch(self) -> bytes:
        """One ``GET`` of :attr:`url`: the body. Raises OSError (urllib's errors included) for no
        answer or a status other than 200, ValueError for a body over :attr:`max_bytes`."""
        req = urllib.request.Request(self.url, headers={"Accept": "application/json"})
        with urllib.request.urlopen(req, timeout=self.timeout_s) as r:   # noqa: S310 (http(s) only)
            if r.status != 200:
                raise OSError(f"e2mgr answered {r.status}")
            body = r.read(self.max_bytes + 1)
        if len(body) > self.max_bytes:
            raise ValueError(f"e2mgr's answer is over {self.max_bytes} octets")
        return body

    def nodes(self) -> tuple[str, ...] | None:
        try:
            got, self.left_out = parse_nodeb_states(self.fetch())
        except (OSError, ValueError) as e:
            self.failures += 1
            log.warning("e2mgr_nodes_unavailable", url=self.url, error=repr(e), failures=self.failures)
            return None
        if self.left_out:
            log.warning("e2mgr_nodes_left_out", url=self.url, count=self.left_out)
        return got

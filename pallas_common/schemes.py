"""The one vocabulary of recovery schemes and session states (docs/model.md §6; paper
section 5, "Baselines" and the ablations), shared by the agent, the xApp and the harness.

A scheme is the ``pallas.v1.Scheme`` enum value; :data:`SCHEMES` says what each does at the
Trigger and at the Commit:

| scheme        | at Trigger                                  | at Commit                                   |
| ------------- | ------------------------------------------- | ------------------------------------------- |
| Pallas        | prefix prefill + suffix block stream        | tail + token ids (ship the rest of suffix)  |
| Pallas-Bridge | as Pallas                                   | the source decodes on (relayed by the new   |
|               |                                             | agent) until the target holds every full    |
|               |                                             | block, then hands over at a token boundary; |
|               |                                             | unprepared: a ctHO attempt, bridged alike   |
| w/o RC        | no prefix: stream every block from block 0  | as Pallas                                   |
| w/o SM        | prefix prefill only, no stream              | token ids; window tokens recomputed         |
| Full-Copy     | nothing                                     | every KV block (split 0)                    |
| Recomputation | nothing                                     | token ids only (split 0, no blocks)         |
| ctHO          | nothing                                     | prefix p* recomputed, blocks >= p* shipped  |
| Detour        | nothing                                     | nothing: the source serves on, the new agent relays |

Session states are ``pallas.v1.SessionState``: ControlReply.state carries the enum
(:meth:`SessionState.from_proto`), SessionTelemetry.state the lower-case name without
``SESSION_`` (:meth:`SessionState.of`).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from pallas_proto import pallas_pb2 as _pb

__all__ = ["Ship", "SchemeSpec", "SCHEMES", "scheme_value", "scheme_name", "spec_for", "label",
           "PALLAS", "PALLAS_BRIDGE", "NO_RC", "NO_SM", "FULL_COPY", "RECOMPUTATION", "CTHO", "DETOUR",
           "NAMES", "COMPARED", "REPLAYED", "ABLATIONS", "RECOVERING", "PROACTIVE", "PROACTIVE_NAMES", "REACTIVE_NAMES",
           "SessionState"]

# The CLI/HTTP/config names (``SchemeSpec.name``), one constant each, for the code that keys
# results or flags by name (the harness, the xApp's config).
PALLAS = "pallas"
PALLAS_BRIDGE = "pallas-bridge"
NO_RC = "no-rc"
NO_SM = "no-sm"
FULL_COPY = "full-copy"
RECOMPUTATION = "recomputation"
CTHO = "ctho"
DETOUR = "detour"


class Ship(str, enum.Enum):
    """Which KV blocks a commit ships."""

    SUFFIX = "suffix"  # those from the split on not yet sent, plus the tail
    ALL = "all"        # every block (split 0)
    NONE = "none"      # token ids only


@dataclass(frozen=True)
class SchemeSpec:
    """What one recovery scheme does at Trigger and at Commit.

    Attributes:
        value: the ``pallas.v1.Scheme`` enum value.
        name: CLI/HTTP name (``pallas``, ``full-copy``, ...).
        proactive: works before the handover (Trigger starts preparation).
        stream_suffix: at Trigger, ship each completed suffix KV block as it completes.
        full_transfer: at Trigger, no prefix recompute: the "suffix" starts at block 0.
        commit_ship: what the Commit ships (:class:`Ship`).
        commit_split: the split at Commit: "keep" (the prepared one), "zero", "ctho"
            (``pallas_common.timing.ctho_split`` on the rates at the commit).
        migrates: False only for Detour (the session stays at the source).
        bridge: at Commit the source decodes on, relayed by the new agent's front, until the
            target holds the state, and hands over at a token boundary (docs/model.md §8).
        label: the paper's display name (``Pallas``, ``Pallas w/o RC``, ``Full-Copy``, ``ctHO``).
    """

    value: int
    name: str
    proactive: bool
    stream_suffix: bool = False
    full_transfer: bool = False
    commit_ship: Ship = Ship.SUFFIX
    commit_split: str = "keep"
    migrates: bool = True
    bridge: bool = False
    label: str = ""


SCHEMES: dict[int, SchemeSpec] = {s.value: s for s in (
    SchemeSpec(_pb.SCHEME_PALLAS, PALLAS, proactive=True, stream_suffix=True, label="Pallas"),
    SchemeSpec(_pb.SCHEME_PALLAS_BRIDGE, PALLAS_BRIDGE, proactive=True, stream_suffix=True,
               bridge=True, label="Pallas-Bridge"),
    SchemeSpec(_pb.SCHEME_NO_RC, NO_RC, proactive=True, stream_suffix=True, full_transfer=True,
               label="Pallas w/o RC"),
    SchemeSpec(_pb.SCHEME_NO_SM, NO_SM, proactive=True, commit_ship=Ship.NONE,
               label="Pallas w/o SM"),
    SchemeSpec(_pb.SCHEME_FULL_COPY, FULL_COPY, proactive=False, commit_ship=Ship.ALL,
               commit_split="zero", label="Full-Copy"),
    SchemeSpec(_pb.SCHEME_RECOMPUTATION, RECOMPUTATION, proactive=False,
               commit_ship=Ship.NONE, commit_split="zero", label="Recomputation"),
    SchemeSpec(_pb.SCHEME_CTHO, CTHO, proactive=False, commit_split="ctho", label="ctHO"),
    SchemeSpec(_pb.SCHEME_DETOUR, DETOUR, proactive=False, commit_ship=Ship.NONE,
               migrates=False, label="Detour"),
)}
_BY_NAME = {s.name: s.value for s in SCHEMES.values()}

NAMES: tuple[str, ...] = tuple(s.name for s in SCHEMES.values())
"""Every scheme's name, in enum order."""
COMPARED: tuple[str, ...] = (PALLAS, DETOUR, FULL_COPY, RECOMPUTATION, CTHO)
"""The paper's five compared schemes (section 6, Figure 5 and Table 2)."""
REPLAYED: tuple[str, ...] = (PALLAS, PALLAS_BRIDGE, DETOUR, FULL_COPY, RECOMPUTATION, CTHO)
"""The replay's default schemes, in its order: the paper's five and this project's bridging."""
ABLATIONS: tuple[str, ...] = (NO_RC, NO_SM)
"""Pallas without recomputation of the prefix / without the suffix stream (Figure 9)."""
RECOVERING: tuple[str, ...] = (FULL_COPY, RECOMPUTATION, CTHO)
"""The reactive baselines that recover the session at the target after the handover."""
PROACTIVE: frozenset[int] = frozenset(v for v, s in SCHEMES.items() if s.proactive)
"""Scheme values that Trigger before the handover; the others only Commit (recover) after it."""
PROACTIVE_NAMES: frozenset[str] = frozenset(SCHEMES[v].name for v in PROACTIVE)
"""The names of :data:`PROACTIVE`."""
REACTIVE_NAMES: frozenset[str] = frozenset(NAMES) - PROACTIVE_NAMES
"""The schemes that act only at the Commit (the xApp's ``fallback`` choices)."""
_ALIASES = {"fullcopy": "full-copy", "full_copy": "full-copy", "recompute": "recomputation",
            "no_rc": "no-rc", "norc": "no-rc", "no_sm": "no-sm", "nosm": "no-sm", "ct-ho": "ctho",
            "bridge": "pallas-bridge", "pallas_bridge": "pallas-bridge"}


def scheme_value(x: int | str | None, default: int = _pb.SCHEME_PALLAS) -> int:
    """A scheme given as enum value, enum name (``SCHEME_CTHO``) or CLI name, as its value.

    ``None``, 0 (``SCHEME_UNSPECIFIED``) and "" give ``default``.

    Raises:
        ValueError: unknown scheme.
    """
    if x is None or x == 0 or x == "":
        return default
    if isinstance(x, int):
        if x in SCHEMES:
            return x
        raise ValueError(f"unknown scheme value {x}")
    key = x.strip().lower()
    if key.startswith("scheme_"):
        key = key[len("scheme_"):].replace("_", "-")
    key = _ALIASES.get(key, key)
    if key in _BY_NAME:
        return _BY_NAME[key]
    raise ValueError(f"unknown scheme {x!r}; choose from {sorted(_BY_NAME)}")


def scheme_name(value: int) -> str:
    """CLI name of a scheme value (``"pallas"``, ...); ``"unspecified"`` for 0."""
    spec = SCHEMES.get(value)
    return spec.name if spec else "unspecified"


def label(x: int | str) -> str:
    """The paper's display name of a scheme given in any form :func:`scheme_value` accepts;
    an unknown name comes back unchanged (a plot legend never fails on it)."""
    try:
        return SCHEMES[scheme_value(x)].label
    except ValueError:
        return str(x)


def spec_for(x: int | str | None, default: int = _pb.SCHEME_PALLAS) -> SchemeSpec:
    """The :class:`SchemeSpec` of a scheme in any form :func:`scheme_value` accepts."""
    return SCHEMES[scheme_value(x, default)]


class SessionState(str, enum.Enum):
    """A session's life cycle at one agent; values are the wire names of
    ``pallas.v1.SessionState`` (lower case, without ``SESSION_``).

    Source: ``SERVING`` -> ``MIGRATING`` (trigger) -> ``COMMITTING`` (frozen at the commit
    point) -> ``HANDED_OVER``; a cancel or failed commit goes back to ``SERVING``. Target:
    ``RESUMED`` after a Sync. Either side ends ``FINISHED`` or ``FAILED``.
    """

    NEW = "new"
    SERVING = "serving"
    MIGRATING = "migrating"
    COMMITTING = "committing"
    HANDED_OVER = "handed_over"
    PREPARING = "preparing"
    RESUMED = "resumed"
    FINISHED = "finished"
    FAILED = "failed"

    @classmethod
    def of(cls, wire: str) -> "SessionState | None":
        """The state a ControlReply/SessionTelemetry ``state`` string names; None for ""
        or a name this version does not know (a newer agent's)."""
        try:
            return cls(wire)
        except ValueError:
            return None

    @classmethod
    def from_proto(cls, value: int) -> "SessionState | None":
        """The state a ``pallas.v1.SessionState`` value (ControlReply.state) names; None for
        SESSION_UNSPECIFIED (the agent does not know the session) or a value this version
        does not know (a newer agent's)."""
        try:
            name = _pb.SessionState.Name(int(value))
        except ValueError:
            return None
        return cls.__members__.get(name.removeprefix("SESSION_")) if value else None

    @classmethod
    def name_of(cls, value: int) -> str | None:
        """The wire name ("serving", ...) of a ``pallas.v1.SessionState`` value, for logs;
        None where :meth:`from_proto` gives None."""
        st = cls.from_proto(value)
        return None if st is None else st.value

    @property
    def proto(self) -> int:
        """The ``pallas.v1.SessionState`` enum value."""
        return _pb.SessionState.Value("SESSION_" + self.name)

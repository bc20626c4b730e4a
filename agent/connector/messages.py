"""Typed messages of the local channel between the agent and the Pallas connector (agent.ipc).

Every message is a frozen dataclass with a wire type name (``TYPE``), on the wire a JSON object
``{"t": TYPE, field: value, ...}``. :func:`decode` checks the type name and every field's type
and range and raises :class:`MessageError` (message type and field) on anything else; unknown
extra keys are ignored. The rules and the table of types, directions and classes:
docs/vllm.md §3.5.
"""

from __future__ import annotations

import dataclasses
import json
import math
import types
import typing
from dataclasses import dataclass
from typing import Any, ClassVar, Union

__all__ = ["MessageError", "Message", "SchedHello", "WorkerHello", "BlockHeader", "Claim",
           "Loaded", "FetchItem", "FetchedItem", "Fetch", "Fetched", "Export", "Stop", "Avail",
           "Bad", "Drop", "Reset", "AgentCommand", "encode_header", "decode"]


class MessageError(ValueError):
    """A header frame that is not a well-formed message of a known type (says which field)."""


@dataclass(frozen=True)
class Message:
    """Base of every channel message; ``TYPE`` is its wire name (the ``"t"`` key), ``ROLE`` a
    hello's sender (the ``"role"`` key; "" for other messages)."""

    TYPE: ClassVar[str] = ""
    ROLE: ClassVar[str] = ""

    def to_header(self) -> dict[str, Any]:
        """The JSON object sent for this message (nested items as positional lists)."""
        out: dict[str, Any] = {"t": self.TYPE, **({"role": self.ROLE} if self.ROLE else {})}
        for f in dataclasses.fields(self):
            out[f.name] = _plain(getattr(self, f.name))
        return out


def _plain(v: Any) -> Any:
    """A field value as JSON: nested items (FetchItem, FetchedItem) as positional lists."""
    if dataclasses.is_dataclass(v):
        return [_plain(getattr(v, f.name)) for f in dataclasses.fields(v)]
    if isinstance(v, tuple):
        return [_plain(x) for x in v]
    return v


# ------------------------------------------------------------------------------ connector -> agent

@dataclass(frozen=True)
class SchedHello(Message):
    """The scheduler side's periodic hello: KV-pool figures (blocks) and policy counters.

    ``num_blocks`` / ``free_blocks``: None until vLLM binds its block pool to the connector.
    """

    TYPE: ClassVar[str] = "hello"
    ROLE: ClassVar[str] = "sched"
    block_size: int
    num_blocks: int | None = None
    free_blocks: int | None = None
    exports: int = 0
    avail_blocks: int = 0
    tracked_reqs: int = 0
    saves_emitted: int = 0
    loads_emitted: int = 0
    pid: int = 0
    # vLLM's kv_transfer_config.kv_load_failure_policy ("recompute" | "fail"; "" = not said)
    load_failure_policy: str = ""


@dataclass(frozen=True)
class WorkerHello(Message):
    """The worker side's hello: the KV layout its mover found (agent.connector.mover) and the
    model facts for the agent's ModelIdentity (``block_bytes`` of one slab, all layers)."""

    TYPE: ClassVar[str] = "hello"
    ROLE: ClassVar[str] = "worker"
    block_bytes: int
    num_layers: int
    dtype: str
    block_shape: tuple[int, ...] = ()
    block_dim: int = 0
    backend: str = ""
    model: str = ""
    model_dtype: str = ""
    kv_cache_dtype: str = "auto"
    block_size: int = 0
    tp_size: int = 1
    pid: int = 0


@dataclass(frozen=True)
class BlockHeader(Message):
    """One KV block the worker copied out (source role); its bytes follow in one frame.

    ``idx`` block index in the session's sequence, ``fill`` valid tokens in it (1..block_size),
    ``crc`` CRC-32C of the data, ``tail`` a snapshot of the partial last block, ``computed``
    tokens computed when it was copied.
    """

    TYPE: ClassVar[str] = "block"
    sid: str
    epoch: int
    idx: int
    fill: int
    crc: int
    tail: bool = False
    computed: int = 0


@dataclass(frozen=True)
class Claim(Message):
    """The scheduler side's report at a resume (target role): tokens served from the local
    prefix cache (``local``) and from received blocks (``external``), of ``num_tokens``; how long
    the request waited for blocks (``waited_s``, seconds); indices that failed their checksum."""

    TYPE: ClassVar[str] = "claim"
    sid: str
    epoch: int
    local: int
    external: int
    num_tokens: int
    waited_s: float = 0.0
    bad: tuple[int, ...] = ()


@dataclass(frozen=True)
class Loaded(Message):
    """The worker's report of one load: block indices copied in and those that failed."""

    TYPE: ClassVar[str] = "loaded"
    sid: str
    epoch: int
    blocks: tuple[int, ...] = ()
    failed: tuple[int, ...] = ()


@dataclass(frozen=True)
class FetchItem:
    """One block a fetch asks for: at least ``need`` valid tokens of block ``idx``."""

    sid: str
    epoch: int
    idx: int
    need: int


@dataclass(frozen=True)
class FetchedItem:
    """One block a fetch got: its fill and CRC-32C (the bytes are the next data frame)."""

    fill: int
    crc: int


@dataclass(frozen=True)
class Fetch(Message):
    """The worker's loader thread asks for received blocks (request id ``rid``)."""

    TYPE: ClassVar[str] = "fetch"
    rid: int
    blocks: tuple[FetchItem, ...]


@dataclass(frozen=True)
class Fetched(Message):
    """The agent's answer to :class:`Fetch` ``rid``: one entry per asked block, None if missing
    or not full enough; a data frame follows for each non-None entry, in order."""

    TYPE: ClassVar[str] = "fetched"
    rid: int
    blocks: tuple[FetchedItem | None, ...]


# ------------------------------------------------------------------------------ agent -> connector

@dataclass(frozen=True)
class Export(Message):
    """Copy out blocks of ``sid`` from ``start_block`` as they complete (``stream``) and, while
    ``tail``, a snapshot of the partial last block every step."""

    TYPE: ClassVar[str] = "export"
    sid: str
    epoch: int
    start_block: int
    stream: bool = True
    tail: bool = True


@dataclass(frozen=True)
class Stop(Message):
    """Stop copying out blocks of ``sid``."""

    TYPE: ClassVar[str] = "stop"
    sid: str


@dataclass(frozen=True)
class Avail(Message):
    """Block ``idx`` of ``sid`` (epoch) is held by the agent with ``fill`` valid tokens."""

    TYPE: ClassVar[str] = "avail"
    sid: str
    epoch: int
    idx: int
    fill: int


@dataclass(frozen=True)
class Bad(Message):
    """Block ``idx`` of ``sid`` (epoch) failed its checksum: do not wait for it."""

    TYPE: ClassVar[str] = "bad"
    sid: str
    epoch: int
    idx: int


@dataclass(frozen=True)
class Drop(Message):
    """Forget every block advertised for ``sid``."""

    TYPE: ClassVar[str] = "drop"
    sid: str


@dataclass(frozen=True)
class Reset(Message):
    """Forget every export and every advertised block (a new agent took the channel)."""

    TYPE: ClassVar[str] = "reset"


AgentCommand = Union[Export, Stop, Avail, Bad, Drop, Reset]

_BY_TYPE: dict[tuple[str, str], type[Message]] = {(c.TYPE, c.ROLE): c for c in (
    SchedHello, WorkerHello, BlockHeader, Claim, Loaded, Fetch, Fetched, Export, Stop, Avail, Bad,
    Drop, Reset)}


def encode_header(msg: Message) -> bytes:
    """The header frame of ``msg``: compact UTF-8 JSON."""
    return json.dumps(msg.to_header(), separators=(",", ":")).encode()


def decode(frame: bytes | memoryview | dict[str, Any]) -> Message:
    """The message a header frame (or an already parsed JSON object) carries.

    Raises:
        MessageError: not UTF-8 JSON, not an object, no or an unknown ``"t"`` (or hello
            ``"role"``), a missing field, or a field of the wrong type or out of range.
    """
    if isinstance(frame, dict):
        obj: Any = frame
    else:
        try:
            obj = json.loads(bytes(frame).decode())
        except (UnicodeDecodeError, ValueError) as exc:
            raise MessageError(f"header is not UTF-8 JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise MessageError(f"header is a JSON {type(obj).__name__}, not an object")
    t = obj.get("t")
    role = obj.get("role") if t == "hello" else ""
    cls = _BY_TYPE.get((t, role)) if isinstance(t, str) and isinstance(role, str) else None
    if cls is None:
        raise MessageError(f"hello with unknown role {role!r}" if t == "hello"
                           else f"unknown message type {t!r}")
    return _build(cls, obj, cls.TYPE)


def _build(cls: type, obj: dict[str, Any], where: str) -> Any:
    hints = _hints(cls)
    kw: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.name not in obj:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise MessageError(f"{where}: missing field {f.name!r}")
            continue
        kw[f.name] = _check(obj[f.name], hints[f.name], f"{where}.{f.name}")
    return cls(**kw)


_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    h = _HINTS.get(cls)
    if h is None:
        h = _HINTS[cls] = typing.get_type_hints(cls)
    return h


def _check(v: Any, typ: Any, where: str) -> Any:
    origin = typing.get_origin(typ)
    if origin in (Union, types.UnionType):
        args = typing.get_args(typ)
        if v is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _check(v, inner[0], where)
    if typ is bool:
        if not isinstance(v, bool):
            raise MessageError(f"{where}: expected a boolean, got {v!r}")
        return v
    if typ is int:
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise MessageError(f"{where}: expected an integer >= 0, got {v!r}")
        return v
    if typ is float:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise MessageError(f"{where}: expected a finite number, got {v!r}")
        return float(v)
    if typ is str:
        if not isinstance(v, str):
            raise MessageError(f"{where}: expected a string, got {v!r}")
        return v
    if origin is tuple:
        if not isinstance(v, list):
            raise MessageError(f"{where}: expected a list, got {v!r}")
        item = typing.get_args(typ)[0]
        return tuple(_check(x, item, f"{where}[{i}]") for i, x in enumerate(v))
    if dataclasses.is_dataclass(typ):
        names = [f.name for f in dataclasses.fields(typ)]
        if not isinstance(v, list) or len(v) != len(names):
            raise MessageError(f"{where}: expected [{', '.join(names)}], got {v!r}")
        return _build(typ, dict(zip(names, v)), where)
    raise MessageError(f"{where}: no check for {typ!r}")  # pragma: no cover - a coding error

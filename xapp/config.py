"""The xApp's configuration: one typed object built from the descriptor's ``controls`` section.

OSC xApps read their descriptor (``config-file.json``) from ``$CONFIG_FILE`` at start, and
ricxappframe's RMRXapp calls the xApp's config handler again with the whole parsed descriptor
whenever the file changes (inotify). The same ``controls`` object is what the OSC onboarder
(``dms_cli onboard``) validates against ``descriptors/schema.json`` (``docs/osc.md``
§3). This module validates ``controls`` against that very schema with
jsonschema's Draft 7 validator and no format checker, exactly as the onboarder does, so the
xApp accepts exactly what onboarding accepts; then it builds the typed sub-configurations.

Public API:

- :func:`load_config_file` (path) and :func:`from_descriptor` (parsed descriptor) and
  :func:`load_controls` (the ``controls`` mapping) -> :class:`XappConfig`; all raise
  :class:`ConfigError`, whose message names every offending field by its path.
- :func:`reload_descriptor` is the body of the xApp's config handler (CONFIG_FILE changed):
  the new configuration, or the current one kept when the new file is invalid.
- :func:`validate_controls` checks only; :func:`controls_schema` returns the schema.

The sub-configurations are the Scheduler Engine's ``SchedulerConfig`` and the predictor's
``PredictorConfig``, built from ``controls.scheduler`` and ``controls.predictor`` by their own
``from_dict`` in :func:`_compose_engines`.
"""

from __future__ import annotations

import copy
import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from types import MappingProxyType
from typing import Any

import structlog
from jsonschema import Draft7Validator

from xapp.predict.config import PredictorConfig
from xapp.scheduler.config import SchedulerConfig, SchedulerConfigError

__all__ = [
    "ConfigError",
    "AgentEndpoint",
    "ProactiveRules",
    "E2SubscriptionConfig",
    "A1Config",
    "ClusterConfig",
    "XappConfig",
    "SCHEMA_ENV",
    "default_schema_path",
    "controls_schema",
    "validate_controls",
    "load_controls",
    "from_descriptor",
    "load_config_file",
    "reload_descriptor",
]

#: Environment variable naming the controls schema file (the container image sets it).
SCHEMA_ENV = "PALLAS_CONTROLS_SCHEMA"

log = structlog.get_logger("xapp.config")


class ConfigError(ValueError):
    """The configuration does not satisfy ``descriptors/schema.json``.

    ``errors`` holds one ``(path, message)`` pair per violation, ``path`` being the dotted
    location inside the descriptor (for example ``controls.scheduler.alpha``); ``str()`` lists
    them all, one per line.
    """

    def __init__(self, errors: list[tuple[str, str]]) -> None:
        self.errors = list(errors)
        lines = "\n".join(f"  {p}: {m}" for p, m in self.errors)
        super().__init__(f"invalid xApp configuration ({len(self.errors)} error(s)):\n{lines}")


@dataclass(frozen=True)
class AgentEndpoint:
    """One Pallas agent (one per gNB edge server).

    ``control_address`` is the host:port of its Control gRPC service (xApp -> agent);
    ``peer_address`` the host:port of its PeerTransfer service, which the xApp hands to a source
    agent as the target's ``PeerEndpoint`` (``proto/pallas_proto/pallas.proto``).
    """

    agent_id: str
    e2_node_id: str
    control_address: str
    peer_address: str


@dataclass(frozen=True)
class ProactiveRules:
    """Where proactive migration (the prepare-before-handover schemes) is allowed.

    ``cells`` maps a cell's global identity (NR cell identity or LTE ECI, int) to on/off;
    ``slices`` maps an S-NSSAI string (``"SST"`` or ``"SST-SD"``, TS 23.003 clause 28.4.2) to
    on/off; ``enabled`` is the default.
    """

    enabled: bool
    cells: Mapping[int, bool] = field(default_factory=dict)
    slices: Mapping[str, bool] = field(default_factory=dict)

    def allows(self, source_cell: int, target_cell: int, slice_id: str | None = None) -> bool:
        """Whether a migration from ``source_cell`` to ``target_cell`` may be proactive.

        The rules present for the source cell, the target cell and the slice are consulted: any
        ``False`` forbids it (the conservative choice wins); otherwise any ``True`` allows it;
        with no rule present, ``enabled`` decides. ``slice_id`` None means the slice is unknown
        (no slice rule applies).
        """
        present = [r for r in (self.cells.get(int(source_cell)), self.cells.get(int(target_cell)),
                               None if slice_id is None else self.slices.get(slice_id))
                   if r is not None]
        if any(r is False for r in present):
            return False
        return True if present else self.enabled


@dataclass(frozen=True)
class E2SubscriptionConfig:
    """Parameters of the E2 subscriptions (made through the subscription manager's REST API)
    and of E2 ingestion.

    ``client_*`` form the subscriptions' ClientEndpoint (where submgr reaches the xApp).
    ``ran_functions`` maps an E2AP RANfunctionID (0..4095) to its service model, ``"rc"``
    (E2SM-RC REPORT style 1, message copy of the NR RRC MeasurementReport) or ``"kpm"``
    (E2SM-KPM REPORT style 4, per-UE measurements); ``report_period_ms`` is the E2SM-KPM
    reporting period; ``kpm_measurements`` maps a KPM measurement name to the
    MeasurementReport field it fills (``rsrp_dbm``, ``rsrq_db``, ``sinr_db``, ``lat``, ``lon``,
    ``speed_mps``, ``heading_deg``, ``serving_cell``, ``serving_pci``).
    """

    submgr_url: str
    client_host: str
    client_http_port: int
    client_rmr_port: int
    ran_functions: Mapping[int, str]
    report_period_ms: int
    kpm_measurements: Mapping[str, str]
    #: E2 node (or "*") -> {"kpm"|"rc": version}: pinned E2SM versions (xapp.e2.ingest.IngestConfig)
    sm_versions: Mapping[str, Mapping[str, str]] = field(default_factory=lambda: MappingProxyType({}))
    #: the RMR receive loop's bounds (``controls.e2.rmr``: batch, handle_max, handle_budget_s,
    #: queue_size, control_queue_size, shed_after_s; xapp.e2.rmrloop.RmrReceiver), given ones only
    rmr: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))

    @property
    def rc_ran_function_ids(self) -> tuple[int, ...]:
        """RAN function ids served by E2SM-RC, ascending."""
        return tuple(sorted(k for k, v in self.ran_functions.items() if v == "rc"))

    @property
    def kpm_ran_function_ids(self) -> tuple[int, ...]:
        """RAN function ids served by E2SM-KPM, ascending."""
        return tuple(sorted(k for k, v in self.ran_functions.items() if v == "kpm"))

    @property
    def rc_ran_function_id(self) -> int | None:
        """The lowest E2SM-RC RAN function id, or None when none is configured (several are
        allowed: subscribe to each of :attr:`rc_ran_function_ids`)."""
        ids = self.rc_ran_function_ids
        return ids[0] if ids else None

    @property
    def kpm_ran_function_id(self) -> int | None:
        """The lowest E2SM-KPM RAN function id, or None when none is configured."""
        ids = self.kpm_ran_function_ids
        return ids[0] if ids else None


@dataclass(frozen=True)
class A1Config:
    """The A1 policy type the xApp serves and the ``handler_id`` it answers with."""

    policy_type_id: int
    handler_id: str


@dataclass(frozen=True)
class ClusterConfig:
    """Scale-out over several replicas of the xApp (``controls.cluster``; issue 46,
    docs/scale-out.md), read at start.

    ``enabled``: share the configured E2 nodes among the replicas through leases in SDL
    (:class:`xapp.cluster.leases.NodeLeases`); False: this replica serves every node.
    ``lease_s``: lease time (s); ``heartbeat_s``: renewal period (s), at most ``lease_s / 3``
    (:meth:`problems`); ``join_delay_s``: how long a starting replica must be seen live before
    nodes are given up to it (s; None: ``lease_s``); ``max_claims`` / ``max_releases``: nodes
    claimed / given up per heartbeat (:func:`xapp.cluster.ownership.plan_leases`).
    ``nodes``: the E2 nodes shared (docs/scale-out.md §2): ``"ric"``, the RIC's (the trace's
    in test mode; live, the E2 manager's list at ``e2mgr_url``, read every
    ``nodes_refresh_s`` with a timeout of ``e2mgr_timeout_s``), or ``"configured"``, the
    agents' ``e2_node_id`` (:attr:`XappConfig.e2_nodes`).
    ``endpoint_host``: the host this replica names in its E2 subscriptions' ClientEndpoint
    (:func:`xapp.cluster.endpoint.replica_host`): ``"service"`` (``client_endpoint.host``,
    the same for every replica), ``"pod_ip"`` (``$POD_IP``) or a template of ``{replica}`` and
    ``{service}``; checked at start (``xapp.main``).
    """

    enabled: bool = False
    lease_s: float = 3.0
    heartbeat_s: float = 1.0
    join_delay_s: float | None = None
    max_claims: int = 16
    max_releases: int = 4
    nodes: str = "ric"
    e2mgr_url: str = "http://service-ricplt-e2mgr-http.ricplt:3800/v1/nodeb/states"
    e2mgr_timeout_s: float = 2.0
    nodes_refresh_s: float = 10.0
    endpoint_host: str = "service"

    #: renewals per lease time at least: a lease survives one late heartbeat and one slow SDL answer
    MIN_BEATS_PER_LEASE = 3

    def problems(self) -> list[tuple[str, str]]:
        """(field path, message) for each combination the schema cannot express (JSON Schema
        draft 7 has no comparison between fields): ``heartbeat_s`` above ``lease_s / 3``. The
        xApp refuses to start with cluster enabled and any of these (``xapp.main``)."""
        limit = self.lease_s / self.MIN_BEATS_PER_LEASE
        if self.heartbeat_s > limit + 1e-9:
            return [("controls.cluster.heartbeat_s",
                     f"{self.heartbeat_s:g} s is above lease_s / {self.MIN_BEATS_PER_LEASE} = "
                     f"{limit:g} s (leases would expire between renewals)")]
        return []


@dataclass(frozen=True)
class XappConfig:
    """The xApp's whole configuration, built from a validated ``controls`` object.

    - ``scheme``: the default recovery scheme (a name of ``pallas_common.schemes.NAMES``, as the
      agent's ``--scheme`` spells it: ``pallas``, ``full-copy``, ``recomputation``, ``ctho``,
      ``detour``, ``no-rc``, ``no-sm``, ``pallas-bridge``); ``fallback``: the recovery of an unprepared or mispredicted target that can
      serve the model (docs/model.md §6).
    - ``proactive``: :class:`ProactiveRules`.
    - ``scheduler``: :class:`xapp.scheduler.config.SchedulerConfig` (the Scheduler Engine's
      parameters; its ``default_goodput_bytes_per_s`` is the Mbit/s value converted once);
      ``predictor``: :class:`xapp.predict.config.PredictorConfig`; ``association_map_path``:
      drive-test CSVs (a file or a folder) the predictor learns its association map, handover
      places and successors from at start ("" = start empty, learn online);
      ``calibration_path``: the confidence calibration tables the predictor maps its raw scores
      with (``pallas_tools.evaluate --save-calibration``; "" = none, the raw scores pass as
      probabilities).
    - ``agents`` (agent id -> :class:`AgentEndpoint`), ``cells`` (cell id -> agent id).
    - ``e2``: :class:`E2SubscriptionConfig`; ``a1``: :class:`A1Config`.
    - ``controls``: a private deep copy of the validated ``controls`` mapping this object was
      built from (the A1 overlay starts from it).
    - ``cluster``: :class:`ClusterConfig` (scale-out; disabled unless ``controls.cluster``
      enables it).
    """

    scheme: str
    fallback: str
    proactive: ProactiveRules
    scheduler: SchedulerConfig
    predictor: PredictorConfig
    association_map_path: str
    agents: Mapping[str, AgentEndpoint]
    cells: Mapping[int, str]
    e2: E2SubscriptionConfig
    a1: A1Config
    controls: Mapping[str, Any]
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    calibration_path: str = ""

    def agent_for_cell(self, cell_id: int) -> AgentEndpoint | None:
        """The agent serving the UEs of cell ``cell_id``, or None when the cell has no edge agent
        (absent from ``cells``, or mapped to an agent id not in ``agents``)."""
        aid = self.cells.get(int(cell_id))
        return None if aid is None else self.agents.get(aid)

    def agent_for_e2_node(self, e2_node_id: str) -> AgentEndpoint | None:
        """The agent at the edge server of E2 node ``e2_node_id``, or None (first match in
        ``agents`` order when several name the same E2 node)."""
        for a in self.agents.values():
            if a.e2_node_id == e2_node_id:
                return a
        return None

    @property
    def e2_nodes(self) -> tuple[str, ...]:
        """The E2 node ids to subscribe to: those named in ``agents``, each once, in order."""
        return tuple(dict.fromkeys(a.e2_node_id for a in self.agents.values()))

    @property
    def unmapped_cells(self) -> tuple[int, ...]:
        """Cells whose agent id is not in ``agents`` (they are treated as having no agent)."""
        return tuple(c for c, a in self.cells.items() if a not in self.agents)


def default_schema_path() -> Path:
    """Where the controls schema is read from: ``$PALLAS_CONTROLS_SCHEMA`` if set, else the
    repository's ``descriptors/schema.json`` beside this package."""
    env = os.environ.get(SCHEMA_ENV)
    if env:
        return Path(env)
    return Path(__file__).resolve().parent.parent / "descriptors" / "schema.json"


@lru_cache(maxsize=8)
def _schema_at(path: str) -> tuple[dict, Draft7Validator]:
    with open(path, encoding="utf-8") as f:
        schema = json.load(f)
    Draft7Validator.check_schema(schema)
    return schema, Draft7Validator(schema)


def controls_schema(path: str | os.PathLike | None = None) -> dict:
    """The controls JSON Schema (draft-07) as a dict (a copy). Raises OSError if unreadable,
    jsonschema.SchemaError if it is not a valid draft-07 schema."""
    return copy.deepcopy(_schema_at(str(path or default_schema_path()))[0])


def _dotted(prefix: str, path) -> str:
    parts = [prefix] + [f"[{p}]" if isinstance(p, int) else str(p) for p in path]
    return ".".join(parts).replace(".[", "[")


def validate_controls(controls: Any, *, schema_path: str | os.PathLike | None = None,
                      prefix: str = "controls") -> None:
    """Validate ``controls`` against the controls schema (Draft 7, no format checks, as the OSC
    onboarder does). Raises :class:`ConfigError` listing every violation by field path."""
    _, validator = _schema_at(str(schema_path or default_schema_path()))
    errors = sorted(validator.iter_errors(controls), key=lambda e: (list(map(str, e.absolute_path)), e.message))
    if errors:
        raise ConfigError([(_dotted(prefix, e.absolute_path), e.message) for e in errors])


def _integers(schema: Mapping[str, Any], node: Mapping[str, Any], value: Any) -> Any:
    """``value`` with every integral float the schema types ``integer`` turned into an int.

    JSON Schema counts 2.0 as an integer, so the schema accepts it; typed configurations that
    check ``isinstance(v, int)`` would not. Walks properties, additionalProperties, items and
    local ``$ref``s (``#/definitions/...``)."""
    while "$ref" in node:
        ref = node["$ref"]
        node = schema
        for part in ref.lstrip("#/").split("/"):
            node = node[part]
    if isinstance(value, float) and node.get("type") == "integer" and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        props = node.get("properties", {})
        extra = node.get("additionalProperties")
        out = {}
        for k, v in value.items():
            sub = props.get(k, extra if isinstance(extra, Mapping) else None)
            out[k] = _integers(schema, sub, v) if sub is not None else v
        return out
    if isinstance(value, list) and isinstance(node.get("items"), Mapping):
        return [_integers(schema, node["items"], v) for v in value]
    return value


def _non_finite(value: Any, path: tuple[str, ...]) -> list[str]:
    """Dotted paths of NaN or infinite floats in ``value``: Python's json module reads the
    tokens NaN and Infinity, but they are not JSON numbers (RFC 8259), and no bound in a JSON
    Schema excludes NaN, so they are refused here."""
    if isinstance(value, float) and not math.isfinite(value):
        return [".".join(path)]
    if isinstance(value, Mapping):
        return [p for k, v in value.items() for p in _non_finite(v, path + (str(k),))]
    if isinstance(value, (list, tuple)):
        return [p for i, v in enumerate(value) for p in _non_finite(v, path[:-1] + (f"{path[-1]}[{i}]",))]
    return []


def _compose_engines(controls: Mapping[str, Any]) -> tuple[SchedulerConfig, PredictorConfig]:
    """Build the Scheduler Engine's and the predictor's sub-configurations from their sections.

    The one place that knows the engines' config classes. The schema is at least as strict as
    their ``from_dict`` checks, so for validated ``controls`` these never raise; if they do
    (the schema and a class drifted apart), the error is reported as a :class:`ConfigError`.
    """
    try:
        scheduler = SchedulerConfig.from_dict(controls["scheduler"])
    except SchedulerConfigError as e:
        raise ConfigError([(f"controls.scheduler.{k}", m) for k, m in e.errors]) from e
    try:
        predictor = PredictorConfig.from_dict(controls["predictor"], where="controls.predictor")
    except ValueError as e:
        raise ConfigError([("controls.predictor", str(e))]) from e
    return scheduler, predictor


def load_controls(controls: Any, *, schema_path: str | os.PathLike | None = None) -> XappConfig:
    """Validate a ``controls`` object and build the :class:`XappConfig`.

    Raises :class:`ConfigError` (naming each offending field) if it does not satisfy the schema
    (or holds a NaN or infinite float, which is no JSON number), and for nothing else.
    """
    validate_controls(controls, schema_path=schema_path)
    bad = _non_finite(controls, ("controls",))
    if bad:
        raise ConfigError([(p, "not a JSON number (NaN or infinity)") for p in bad])
    schema = _schema_at(str(schema_path or default_schema_path()))[0]
    c = _integers(schema, schema, copy.deepcopy(controls))
    scheduler, predictor = _compose_engines(c)
    p = c["proactive"]
    e2 = c["e2"]
    ep = e2["client_endpoint"]
    return XappConfig(
        scheme=c["scheme"],
        fallback=c["fallback"],
        proactive=ProactiveRules(
            enabled=p["enabled"],
            cells=MappingProxyType({int(k): v for k, v in p["cells"].items()}),
            slices=MappingProxyType(dict(p["slices"]))),
        scheduler=scheduler,
        predictor=predictor,
        association_map_path=c["association_map"]["path"],
        calibration_path=c["association_map"].get("calibration", ""),
        agents=MappingProxyType({aid: AgentEndpoint(aid, a["e2_node_id"], a["control_address"],
                                                    a["peer_address"])
                                 for aid, a in c["agents"].items()}),
        cells=MappingProxyType({int(k): v for k, v in c["cells"].items()}),
        e2=E2SubscriptionConfig(
            submgr_url=e2["submgr_url"], client_host=ep["host"],
            client_http_port=int(ep["http_port"]), client_rmr_port=int(ep["rmr_port"]),
            ran_functions=MappingProxyType({int(k): v for k, v in e2["ran_functions"].items()}),
            report_period_ms=int(e2["report_period_ms"]),
            kpm_measurements=MappingProxyType(dict(e2["kpm_measurements"])),
            sm_versions=MappingProxyType({k: dict(v) for k, v in e2.get("sm_versions", {}).items()}),
            rmr=MappingProxyType(dict(e2.get("rmr", {})))),
        a1=A1Config(policy_type_id=int(c["a1"]["policy_type_id"]), handler_id=c["a1"]["handler_id"]),
        controls=MappingProxyType(c),
        cluster=_cluster(c.get("cluster") or {}),
    )


def _cluster(c: Mapping[str, Any]) -> ClusterConfig:
    """``controls.cluster`` (validated) as a :class:`ClusterConfig`, defaults for what is absent."""
    d = ClusterConfig()
    jd = c.get("join_delay_s")
    return ClusterConfig(enabled=bool(c.get("enabled", d.enabled)),
                         lease_s=float(c.get("lease_s", d.lease_s)),
                         heartbeat_s=float(c.get("heartbeat_s", d.heartbeat_s)),
                         join_delay_s=None if jd is None else float(jd),
                         max_claims=int(c.get("max_claims", d.max_claims)),
                         max_releases=int(c.get("max_releases", d.max_releases)),
                         nodes=str(c.get("nodes", d.nodes)),
                         e2mgr_url=str(c.get("e2mgr_url", d.e2mgr_url)),
                         e2mgr_timeout_s=float(c.get("e2mgr_timeout_s", d.e2mgr_timeout_s)),
                         nodes_refresh_s=float(c.get("nodes_refresh_s", d.nodes_refresh_s)),
                         endpoint_host=str(c.get("endpoint_host", d.endpoint_host)))


def from_descriptor(descriptor: Any, *, schema_path: str | os.PathLike | None = None) -> XappConfig:
    """Build the configuration from a whole parsed descriptor (what RMRXapp hands the config
    handler): its ``controls`` section. Raises :class:`ConfigError` if the descriptor is not an
    object, has no ``controls``, or ``controls`` is invalid."""
    if not isinstance(descriptor, Mapping):
        raise ConfigError([("<descriptor>", f"expected a JSON object, got {type(descriptor).__name__}")])
    if "controls" not in descriptor:
        raise ConfigError([("controls", "the descriptor has no 'controls' section")])
    return load_controls(descriptor["controls"], schema_path=schema_path)


def _no_constants(token: str) -> Any:
    raise ValueError(f"{token} is not a JSON number")


def load_config_file(path: str | os.PathLike | None = None, *,
                     schema_path: str | os.PathLike | None = None) -> XappConfig:
    """Read the descriptor at ``path`` (default ``$CONFIG_FILE``) and build the configuration.

    Raises :class:`ConfigError` for an unset path, an unreadable file, invalid JSON (with line
    and column; also invalid UTF-8, NaN/Infinity tokens and nesting too deep to parse) or an
    invalid ``controls`` section.
    """
    path = path or os.environ.get("CONFIG_FILE")
    if not path:
        raise ConfigError([("CONFIG_FILE", "no descriptor path given and CONFIG_FILE is not set")])
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f, parse_constant=_no_constants)
    except OSError as e:
        raise ConfigError([(str(path), f"cannot read: {e.strerror or e}")]) from e
    except json.JSONDecodeError as e:
        raise ConfigError([(str(path), f"not JSON: {e.msg} at line {e.lineno} column {e.colno}")]) from e
    except ValueError as e:  # NaN / Infinity tokens, invalid UTF-8
        raise ConfigError([(str(path), f"not JSON: {e}")]) from e
    except RecursionError:  # json's C decoder recurses per nesting level
        raise ConfigError([(str(path), "not a descriptor: JSON nested too deeply")]) from None
    return from_descriptor(doc, schema_path=schema_path)


def reload_descriptor(descriptor: Any, current: XappConfig | None, *,
                      schema_path: str | os.PathLike | None = None) -> XappConfig | None:
    """Handle a changed descriptor (ricxappframe calls the config handler with the parsed
    ``$CONFIG_FILE`` whenever it changes): return the new :class:`XappConfig`, or, if the new
    descriptor is invalid, log every offending field and return ``current`` unchanged (the xApp
    runs on with its last good configuration)."""
    try:
        cfg = from_descriptor(descriptor, schema_path=schema_path)
    except ConfigError as e:
        log.error("config_rejected", errors=[f"{p}: {m}" for p, m in e.errors],
                  kept="previous" if current is not None else "none")
        return current
    log.info("config_loaded", scheme=cfg.scheme, agents=len(cfg.agents), cells=len(cfg.cells))
    return cfg

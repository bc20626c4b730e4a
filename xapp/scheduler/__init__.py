"""The Scheduler Engine (paper §4.2-§4.4): window decision, telemetry, admission, state machine.

Pure code without I/O: the timing model lives in :mod:`pallas_common.timing`; this package
adds the xApp side (typed config, EWMA telemetry, admission, the per-session migration state
machine and the vectorised control cycle). The composition root sends the actions it returns.
"""

from .admission import AdmissionResult, ModelKey, ServerState, admit, incompatibility
from .config import SchedulerConfig, SchedulerConfigError
from .engine import SchedulerEngine
from .state import (Action, CancelAction, CommitAction, DecidedRates, InvalidTransition,
                    MigrationState, PreparedTarget, SessionMigration, TriggerAction)
from .telemetry import EwmaTable, SessionSample, TelemetryStore

__all__ = [
    "Action", "AdmissionResult", "CancelAction", "CommitAction", "DecidedRates", "EwmaTable",
    "InvalidTransition", "MigrationState", "ModelKey", "PreparedTarget", "SchedulerConfig", "SchedulerConfigError", "SchedulerEngine",
    "ServerState", "SessionMigration", "SessionSample", "TelemetryStore", "TriggerAction",
    "admit", "incompatibility",
]

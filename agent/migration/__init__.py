"""One migration engine per agent: source and target of every scheme (paper section 4.3)."""

from agent.migration.engine import Ledger, MigrationConfig, MigrationEngine
from agent.migration.source import Outbound
from agent.migration.states import SourceState, TargetState
from agent.migration.target import Inbound

__all__ = ["Inbound", "Ledger", "MigrationConfig", "MigrationEngine", "Outbound", "SourceState",
           "TargetState"]

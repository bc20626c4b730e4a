"""One migration engine per agent: source and target of every scheme (paper section 4.3)."""

from agent.migration.context import Context, Ledger, MigrationConfig
from agent.migration.migration_engine import MigrationEngine
from agent.migration.source import Outbound
from agent.states import SourceState, TargetState
from agent.migration.target import Inbound

__all__ = ["Context", "Inbound", "Ledger", "MigrationConfig", "MigrationEngine", "Outbound",
           "SourceState", "TargetState"]

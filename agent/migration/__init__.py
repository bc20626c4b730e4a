"""One migration engine per agent: source and target of every scheme (paper section 4.3)."""

from agent.migration.attempts import Attempts, Inbound, Outbound
from agent.migration.context import Context, Ledger, MigrationConfig
from agent.migration.migration_engine import MigrationEngine
from agent.states import SourceState, TargetState

__all__ = ["Attempts", "Context", "Inbound", "Ledger", "MigrationConfig", "MigrationEngine", "Outbound",
           "SourceState", "TargetState"]

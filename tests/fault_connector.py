"""A fault-injecting Pallas connector for the e2e tests (kept out of the product), as vLLM's own
tests use connectors that fail loads: vLLM loads it in place of the Pallas connector with
``kv_connector_module_path="tests.fault_connector"``, ``kv_connector="FaultyPallasConnector"``.

Its worker side drops blocks that arrived and pass their CRC-32C check, at the moment they
would be copied into the engine (a block gone bad or missing in the target's store between
arrival and load): the product's loader thread fetches and verifies them, this does not let
them be copied in, so they are reported failed to vLLM (``get_block_ids_with_load_errors``)
and to the agent (``Loaded.failed``), as a real load failure is. How many to drop comes from a control file the test writes, named by
``kv_connector_extra_config["fault_file"]``: a JSON object ``{"drop_loads": N}``; the worker
drops loads while fewer than N were dropped in this process (the test raises N to inject
one more). No file, or no key: nothing is dropped.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any

from agent.connector.mover import WorkerSide
from agent.connector.block_policy import LoadOp
from agent.connector.vllm_connector import PallasConnector

log = logging.getLogger("vllm.pallas.faults")


class DroppingWorkerSide(WorkerSide):
    """:class:`WorkerSide` that drops the loads the control file asks for."""

    def __init__(self, address: str, extra_hello: dict[str, Any] | None, fault_file: str) -> None:
        super().__init__(address, extra_hello)
        self.fault_file = fault_file
        self.dropped = 0

    def _wanted(self) -> int:
        try:
            with open(self.fault_file) as fh:
                return int(json.load(fh).get("drop_loads", 0))
        except (OSError, ValueError, TypeError, AttributeError):
            return 0

    def _verified(self, op: LoadOp, ent: Any) -> bytes | None:
        data = super()._verified(op, ent)
        if data is None or not self.fault_file or self.dropped >= self._wanted():
            return data
        self.dropped += 1     # not copied in: reported failed to vLLM and to the agent
        log.warning("pallas fault: dropped block %d of %s (epoch %d) at its load after its "
                    "checksum passed (%d dropped)", op.idx, op.sid, op.epoch, self.dropped)
        return None


class FaultyPallasConnector(PallasConnector):
    """The Pallas connector with :class:`DroppingWorkerSide` as its worker side."""

    def __init__(self, vllm_config, role, kv_cache_config=None) -> None:
        super().__init__(vllm_config, role, kv_cache_config)
        if self.worker is not None:
            extra = vllm_config.kv_transfer_config.kv_connector_extra_config or {}
            fault_file = str(extra.get("fault_file") or os.environ.get("PALLAS_FAULT_FILE", ""))
            self.worker = DroppingWorkerSide(self.worker.address, self.worker._extra, fault_file)

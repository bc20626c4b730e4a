"""A fault-injecting Pallas connector for the e2e tests (kept out of the product), as vLLM's own
tests use connectors that fail loads: vLLM loads it in place of the Pallas connector with
``kv_connector_module_path="tests.fault_connector"``, ``kv_connector="FaultyPallasConnector"``.

Its worker side drops blocks that arrived and pass their CRC-32C check, at the moment they
would be copied into the engine (a block gone bad or missing in the target's store between
arrival and load): it fetches and verifies them as the product does, does not copy them in,
and reports them failed to vLLM (``get_block_ids_with_load_errors``) and to the agent
(``Loaded.failed``), as a real load failure is. How many to drop comes from a control file the test writes, named by
``kv_connector_extra_config["fault_file"]``: a JSON object ``{"drop_loads": N}``; the worker
drops loads while fewer than N were dropped in this process (the test raises N to inject
one more). No file, or no key: nothing is dropped.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any

from agent.connector.messages import FetchItem, Loaded
from agent.connector.mover import WorkerSide
from agent.connector.policy import LoadOp
from agent.connector.link import block_crc
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

    def load(self, loads: list[LoadOp]) -> None:
        wanted = self._wanted() if self.fault_file and loads else 0
        drop = []
        while loads and self.dropped + len(drop) < wanted and len(drop) < len(loads):
            drop.append(loads[len(drop)])
        super().load(loads[len(drop):])
        if not drop or self.link is None:
            return
        got = self.link.fetch([FetchItem(sid, epoch, idx, need)
                               for sid, epoch, idx, _, need in drop])
        for (sid, epoch, idx, block_id, need), ent in zip(drop, got):
            verified = ent is not None and ent[0] >= need and block_crc(ent[2]) == ent[1]
            self.dropped += 1
            self._errors.add(block_id)          # vLLM: this block failed to load
            self.link.report(Loaded(sid, epoch, (), (idx,)))
            log.warning("pallas fault: dropped block %d of %s (epoch %d) at its load "
                        "(checksum %s; %d dropped)", idx, sid, epoch,
                        "passed" if verified else "NOT passed", self.dropped)


class FaultyPallasConnector(PallasConnector):
    """The Pallas connector with :class:`DroppingWorkerSide` as its worker side."""

    def __init__(self, vllm_config, role, kv_cache_config=None) -> None:
        super().__init__(vllm_config, role, kv_cache_config)
        if self.worker is not None:
            extra = vllm_config.kv_transfer_config.kv_connector_extra_config or {}
            fault_file = str(extra.get("fault_file") or os.environ.get("PALLAS_FAULT_FILE", ""))
            self.worker = DroppingWorkerSide(self.worker.address, self.worker._extra, fault_file)

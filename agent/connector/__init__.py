"""The Pallas KV connector package (vLLM's KV connector API, KVConnectorBase_V1).

vLLM loads ``PallasConnector`` from this package through ``--kv-transfer-config``
(docs/vllm.md §3):

- :mod:`agent.connector.block_policy`: scheduler-side block bookkeeping, free of vLLM types;
- :mod:`agent.connector.mover`: worker-side whole-block slab copies;
- :mod:`agent.connector.vllm_connector`: the KVConnectorBase_V1 class adapting vLLM's hooks.

The vLLM class is imported lazily (PEP 562), so the policy and mover import without vLLM.
"""

from __future__ import annotations

from typing import Any

__all__ = ["PallasConnector", "PallasConnectorMetadata"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from agent.connector import vllm_connector
        return getattr(vllm_connector, name)
    raise AttributeError(f"module 'agent.connector' has no attribute {name!r}")

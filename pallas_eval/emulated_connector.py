"""``EmulatedPallasConnector``: the product's Pallas connector with every engine step paced to
an emulated model's prefill and decode rates (pallas_eval/emulation.py explains the pacing and
its extra config). vLLM loads it with::

    {"kv_connector": "EmulatedPallasConnector",
     "kv_connector_module_path": "pallas_eval.emulated_connector", "kv_role": "kv_both",
     "kv_connector_extra_config": {"agent_address": "...", "prefill_tokens_per_s": 1850,
                                   "decode_tokens_per_s": 25, "stats_path": "..."}}

(``pallas-agent --kv-connector-module pallas_eval.emulated_connector --kv-connector-class
EmulatedPallasConnector --kv-connector-extra '{...}'``). This module imports vLLM and torch.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Callable

from agent.connector.vllm_connector import PallasConnector, PallasConnectorMetadata
from pallas_eval.emulation import PaceStats, extra_rate, step_seconds

if TYPE_CHECKING:
    from vllm.config import VllmConfig

__all__ = ["EmulatedMetadata", "EmulatedPallasConnector"]


@dataclass
class EmulatedMetadata(PallasConnectorMetadata):
    """The product's metadata plus this step's emulated duration (seconds) and its parts."""

    pace_s: float = 0.0
    prefill_tokens: int = 0
    decode_reqs: int = 0


class EmulatedPallasConnector(PallasConnector):
    """The Pallas connector with every engine step paced to an emulated model's rates
    (module docstring). Load it with ``"kv_connector": "EmulatedPallasConnector",
    "kv_connector_module_path": "pallas_eval.emulated_connector"``.

    Raises (at construction):
        ValueError: a missing or non-positive ``prefill_tokens_per_s`` /
            ``decode_tokens_per_s``.
    """

    def __init__(self, vllm_config: "VllmConfig", role: Any, kv_cache_config: Any = None,
                 *, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        extra = vllm_config.kv_transfer_config.kv_connector_extra_config or {}
        self.r_p = extra_rate(extra, "prefill_tokens_per_s")
        self.r_d = extra_rate(extra, "decode_tokens_per_s")
        self._stats_path = extra.get("stats_path") or None
        self._clock, self._sleep = clock, sleep
        self._t0: float | None = None
        self._last_end: float | None = None
        self._written = 0.0
        self.pace_stats = PaceStats()
        super().__init__(vllm_config, role, kv_cache_config)

    # scheduler side: the step's emulated duration
    def build_connector_meta(self, scheduler_output: Any) -> Any:
        meta = super().build_connector_meta(scheduler_output)
        prefill, decode, secs = step_seconds(scheduler_output.num_scheduled_tokens, self.r_p, self.r_d)
        return EmulatedMetadata(saves=meta.saves, loads=meta.loads, pace_s=secs,
                                prefill_tokens=prefill, decode_reqs=decode)

    # worker side: the step starts when its metadata is bound, ends no earlier than pace_s later
    def bind_connector_metadata(self, connector_metadata: Any) -> None:
        self._t0 = self._clock()
        super().bind_connector_metadata(connector_metadata)

    def wait_for_save(self) -> None:
        """End the step no earlier than its emulated duration after it began. A step that
        follows the previous one closer than its duration (the engine busy: only the
        scheduler's and the output's work between them) is paced from the previous step's end
        instead, so that the engine's step *period*, which the UEs see, is the emulated one:
        pacing the forward pass alone left the 3-6 ms of work between steps on top (the UEs saw
        22.3 tokens/s against 25 under load)."""
        super().wait_for_save()
        meta = self._get_connector_metadata() if self.has_connector_metadata() else None
        t0, self._t0 = self._t0, None
        if not isinstance(meta, EmulatedMetadata) or t0 is None or meta.pace_s <= 0:
            return
        start = t0
        if self._last_end is not None and 0.0 <= t0 - self._last_end < meta.pace_s:
            start = self._last_end        # back to back: the gap since is part of this step
        work = self._clock() - t0
        left = start + meta.pace_s - self._clock()
        if left > 0:
            self._sleep(left)
        end = self._clock()
        self._last_end = end
        self.pace_stats.observe(meta.prefill_tokens, meta.decode_reqs, meta.pace_s, work, end - start)
        if self._stats_path and end - self._written >= 1.0:
            self._written = end
            self.write_stats()

    def write_stats(self) -> None:
        """Rewrite ``stats_path`` with :class:`PaceStats` and the emulated rates (atomically)."""
        st = self.pace_stats
        st.r_p, st.r_d = self.r_p, self.r_d
        doc = {**asdict(st), "measured_r_p": st.measured_r_p(), "measured_r_d": st.measured_r_d(),
               "pid": os.getpid(), "time": time.time()}
        tmp = f"{self._stats_path}.{os.getpid()}.tmp"
        try:
            with open(tmp, "w") as f:
                json.dump(doc, f)
            os.replace(tmp, self._stats_path)
        except OSError:
            pass

    def shutdown(self) -> None:
        if self._stats_path and self.pace_stats.steps:
            self.write_stats()
        super().shutdown()

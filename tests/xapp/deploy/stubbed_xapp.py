"""``pallas-xapp`` in this process with RMR's C library stubbed (tests/xapp/fake_rmr.py): what
the container's command runs, for tests that start the xApp as a separate process.

    python tests/xapp/deploy/stubbed_xapp.py [pallas-xapp arguments]

The environment is the container's (``CONFIG_FILE``, ``DBAAS_SERVICE_HOST``/``PORT``, ...).
``PALLAS_TEST_RMR_INFLOW=TRACE``: the E2 trace's records arrive at RMR one by one, at their
recorded pace (``PALLAS_TEST_RMR_INFLOW_SPEED`` times faster, default 1), starting
``PALLAS_TEST_RMR_INFLOW_DELAY_S`` (default 1) seconds after start, as an E2 termination would
deliver them. ``PALLAS_TEST_HANG_POLICY_CLOSE=1``: the policy client's close never returns (a
shutdown step that hangs, for ``--shutdown-s``). The exit status is pallas-xapp's.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))      # tests/xapp: fake_rmr

import pytest  # noqa: E402 - after the path

from fake_rmr import FakeRmrLib  # noqa: E402


def _inflow(lib: FakeRmrLib, trace: str, delay_s: float, speed: float) -> None:
    from xapp.e2.trace import read_trace
    time.sleep(delay_s)
    t0 = w0 = None
    for r in read_trace(trace):
        if t0 is None:
            t0, w0 = r.time, time.monotonic()
        wait = w0 + (r.time - t0) / speed - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        lib.push(r.mtype, r.payload, r.e2_node.encode(), r.sub_id)


def main() -> int:
    config = os.environ.get("CONFIG_FILE")
    lib = FakeRmrLib().install(pytest.MonkeyPatch())      # it clears CONFIG_FILE; the container sets it
    if config is not None:
        os.environ["CONFIG_FILE"] = config
    trace = os.environ.get("PALLAS_TEST_RMR_INFLOW")
    if trace:
        delay = float(os.environ.get("PALLAS_TEST_RMR_INFLOW_DELAY_S", "1"))
        speed = float(os.environ.get("PALLAS_TEST_RMR_INFLOW_SPEED", "1"))
        threading.Thread(target=_inflow, args=(lib, trace, delay, speed), daemon=True).start()
    if os.environ.get("PALLAS_TEST_HANG_POLICY_CLOSE"):
        from xapp.policy import PolicyClient
        PolicyClient.close = lambda self: threading.Event().wait()
    from xapp.main import main as xapp_main
    return xapp_main(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())

"""What mutual TLS costs the PeerTransfer block stream (issue 16).

Prints the goodput of the agents' block stream on loopback (a real PeerTransferService in its
own process, a PeerClient here; benchmarks/stream.py's goodput test) in plaintext and over
mutual TLS (pallas_common.tls: client certificates required, the authorisation interceptor in
front), the median of ``--rounds`` streams each, with the CPU time per block of each side. The
certificates come from a throwaway CA (pallas_eval.localca, ECDSA P-256).

Usage:
    .venv/agent/bin/python benchmarks/tls_stream.py [--blocks 200] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "proto"), str(ROOT / "benchmarks")]

from pallas_eval.localca import LocalCA  # noqa: E402
from pallas_common.tls import LinkSecurity  # noqa: E402
from stream import WARMUP_BLOCKS, _in_server, _serve, _spread, goodput  # noqa: E402
from agent.wire import tune_malloc_for_blocks  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--blocks", type=int, default=200, help="blocks per measured stream")
    ap.add_argument("--rounds", type=int, default=3, help="measured streams per mode")
    ap.add_argument("--block-bytes", type=int, default=786_432, help="the 152M model's KV block")
    a = ap.parse_args()
    tune_malloc_for_blocks()
    with tempfile.TemporaryDirectory(prefix="pallas-tls-bench-") as d:
        ca = LocalCA("bench-ca")
        server_files, client_files = ca.write(d, "agent-a"), ca.write(d, "agent-b")
        sent = WARMUP_BLOCKS + a.rounds * a.blocks
        for name, srv, cli in (("plaintext ", None, None),
                               ("mutual TLS", server_files, client_files)):
            def run(addr, cli=cli):
                factory = LinkSecurity(cli).aio_channel if cli else None
                return asyncio.run(goodput(addr, n_blocks=a.blocks, block_bytes=a.block_bytes,
                                           rate_mbps=None, rounds=a.rounds,
                                           channel_factory=factory))
            (rates, rej), cs, cr = _in_server(functools.partial(_serve, tls_files=srv), run)
            print(f"{name}: {_spread(rates, 1e-9)} GB/s  CPU/block sender "
                  f"{1e6 * cs / sent:5.0f} us, receiver {1e6 * cr / sent:5.0f} us  "
                  f"({a.rounds} x {a.blocks} blocks of {a.block_bytes} B, rejected {rej}; both "
                  f"ends share this host's {os.cpu_count()} CPUs)")


if __name__ == "__main__":
    main()

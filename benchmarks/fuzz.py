"""Fuzz the agent's input parsers for a long run by hand (issue 16, "Fuzzing with a budget").

    .venv/agent/bin/python benchmarks/fuzz.py [--n 100000] [--parser kvblock|front|a1|descriptor|all]
        [--seed S] [--n-descriptor 20000]

(E2 indications have their own long run, in the xApp's environment: benchmarks/e2_fuzz.py.)

Parsers and what counts as a crash:
- ``kvblock``: ``agent.wire.decode_block`` (the PeerTransfer block stream) on KVBlock messages
  built field by field, their byte mutations and truncations (tests/agent/fuzz_inputs.py).
  A crash: any exception other than protobuf's ``DecodeError``, or an outcome (accept/refuse,
  decoded values) that differs from the generated ``pallas_pb2.KVBlock`` class.
- ``front``: ``SessionFront.parse_open`` (the body of ``POST /v1/sessions``) on JSON objects
  with valid, wrongly typed and out-of-range fields, byte-mutated JSON and deep nesting.
  A crash: any exception other than ``RequestError`` (a 400), or an accepted request that
  breaks a rule of ``OpenRequest`` (token ids outside [0, vocab), min > max, context length).
- ``a1``: ``xapp.a1.A1PolicyHandler.process`` (A1_POLICY_REQ bodies, both the contract's and the
  OSC mediator's form, valid and not) through one long-lived handler. A crash: an exception, an
  answer outside the A1-xApp contract, an ERROR that changed the configuration, a window grid
  over its cap or more live instances than ``MAX_INSTANCES``.
- ``descriptor``: ``xapp.config.load_config_file`` on descriptor files (the shipped
  descriptors/config-file.json edited and byte-mutated). A crash: an exception other than
  ``ConfigError``, an error naming no field, or loader and descriptors/schema.json disagreeing.
  Each input costs a schema validation (ms): ``--n-descriptor`` sets its own budget.
  (Inputs and checks of both: tests/xapp/deploy/descriptor_fuzz.py, shared with the tests.)

Prints, per parser: inputs tried, crashes (each crashing input is written to
``--out``/crash-<parser>-<n>.bin for a regression test), the slowest input's parse time (CPU time
of the parsing thread; the 20 slowest of the run timed again alone, best of 5, collector off,
beside the worst single timing observed in the run) and size, inputs per second (wall, one process), and the process's memory after the run (RSS now
and peak). Inputs: a pool of ``--seeds`` inputs from the hypothesis strategies (generate-only,
no shrinking: a crash is recorded and the run goes on; hypothesis costs a few ms per input),
then, until ``--n``, random mutations of pool members (byte flips, insertions, deletions,
truncations, splices of two members, duplicated spans; for the front also a field set to a
value from a list of edge values), a few microseconds each.
"""

from __future__ import annotations

import argparse
import gc
import heapq
import json
import logging
import random
import resource
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "proto"), str(ROOT / "tests" / "agent"),
                str(ROOT / "tests" / "xapp" / "deploy")]

import structlog  # noqa: E402
from google.protobuf.message import DecodeError  # noqa: E402
from hypothesis import HealthCheck, Phase, given, seed as hseed, settings  # noqa: E402

from pallas_proto import pallas_pb2 as pb  # noqa: E402
from agent.wire import decode_block  # noqa: E402
from agent.frontend import RequestError, SessionFront  # noqa: E402
from agent.session import SessionStore  # noqa: E402
from fuzz_inputs import front_raw_bodies, kvblock_messages, kvblock_mutants  # noqa: E402
from descriptor_fuzz import (a1_requests, descriptor_files, make_check_a1,  # noqa: E402
                             make_check_descriptor)
from hypothesis import strategies as st  # noqa: E402

VOCAB, MAX_LEN = 2048, 4096


def _fields(b) -> tuple:
    return (b.session_id, b.epoch, b.block_index, b.fill, b.checksum, bytes(b.data))


def check_kvblock(buf: bytes) -> None:
    """Raise AssertionError when decode_block and the generated class disagree on ``buf``."""
    try:
        ref = _fields(pb.KVBlock.FromString(buf))
    except DecodeError:
        ref = None
    try:
        got = _fields(decode_block(buf))
    except DecodeError:
        got = None
    assert got == ref, f"decode_block {got!r} != generated class {ref!r}"


def make_check_front():
    front = SessionFront(SessionStore(), None, agent_id="fuzz", vocab_size=VOCAB, max_model_len=MAX_LEN)

    def check_front(raw: bytes) -> None:
        try:
            req = front.parse_open(raw)
        except RequestError as e:
            assert str(e), "an empty error message"
            return
        ids = req.token_ids
        assert ids and all(type(t) is int and 0 <= t < VOCAB for t in ids), "token id outside the vocabulary"
        assert all(type(t) is int and 0 <= t < VOCAB for t in req.stop_token_ids), "stop id outside the vocabulary"
        assert 1 <= req.max_tokens and 0 <= req.min_tokens <= req.max_tokens, "max/min tokens"
        assert len(ids) + req.max_tokens <= MAX_LEN, "context length"
        assert 0 <= req.temperature <= 2 and 0 < req.top_p <= 1 and req.top_k >= -1, "sampling ranges"
        sp = req.sampling()
        assert type(sp.max_tokens) is int and type(sp.ignore_eos) is bool

    return check_front


EDGE_VALUES = [0, 1, -1, 2, VOCAB - 1, VOCAB, MAX_LEN, MAX_LEN + 1, 2**31 - 1, 2**31, 2**63 - 1, 2**63, -(2**63),
               -(2**63) - 1, 2**64, 10**30, 0.0, -0.0, 0.5, 1.0, 2.0, 2.0000001, 1e308, -1e-308, True, False, None,
               "", "8", "1e3", "ue-7/chat?1", "a" * 65, "\u0000", "\ud7ff" * 3, [], [1], [VOCAB], [-1], [[1]],
               [1, "2"], [2**63] * 3, {}, {"a": 1}]


def mutate_bytes(rng: random.Random, buf: bytes, pool: list[bytes]) -> bytes:
    """One to four byte-level mutations of ``buf`` (flip, insert, delete, truncate, splice, repeat)."""
    b = bytearray(buf)
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(6)
        if not b or op == 4:  # splice: a prefix of this and a suffix of another pool member
            other = rng.choice(pool)
            b = b[:rng.randint(0, len(b))] + other[rng.randint(0, len(other)):]
        elif op == 0:
            b[rng.randrange(len(b))] ^= 1 << rng.randrange(8) if rng.random() < 0.5 else rng.randrange(1, 256)
        elif op == 1:
            b.insert(rng.randint(0, len(b)), rng.randrange(256))
        elif op == 2:
            del b[rng.randrange(len(b))]
        elif op == 3:
            del b[rng.randint(0, len(b) - 1):]
        else:  # repeat a span (repeated fields, runs of group tags)
            i = rng.randrange(len(b))
            j = min(len(b), i + rng.randint(1, 16))
            b[i:i] = b[i:j] * rng.randint(1, 8)
    return bytes(b)


def mutate_json(rng: random.Random, buf: bytes, pool: list[bytes]) -> bytes:
    """Half the time set one field of a JSON object, at any depth of nested objects, to an edge
    value (or drop it); else byte mutations."""
    if rng.random() < 0.5:
        try:
            body = json.loads(buf)
        except (ValueError, RecursionError):
            body = None
        node = body
        while isinstance(node, dict) and node:
            key = rng.choice(sorted(node))
            if isinstance(node[key], dict) and node[key] and rng.random() < 0.6:
                node = node[key]
                continue
            if rng.random() < 0.15:
                del node[key]
            else:
                node[key] = rng.choice(EDGE_VALUES)
            return json.dumps(body).encode()
    return mutate_bytes(rng, buf, pool)


def fuzz(name: str, strategy, check, mutate, n: int, seeds: int, seed: int, out: Path) -> dict:
    stats = {"tried": 0, "crashes": 0, "slowest_s": 0.0, "slowest_len": 0, "first_crash": None}
    pool: list[bytes] = []
    slowest: list[tuple[float, int, bytes]] = []  # the 20 slowest (min-heap on time)

    def attempt(buf: bytes) -> None:
        stats["tried"] += 1
        t0 = time.thread_time()  # CPU time of this thread: preemption on a shared host does not count
        try:
            check(buf)
        except Exception:  # noqa: BLE001 - every failure is recorded, the run goes on
            stats["crashes"] += 1
            path = out / f"crash-{name}-{stats['crashes']}.bin"
            path.write_bytes(buf)
            if stats["first_crash"] is None:
                stats["first_crash"] = f"{path}: {traceback.format_exc(limit=3)}"
        dt = time.thread_time() - t0
        if len(slowest) < 20:
            heapq.heappush(slowest, (dt, stats["tried"], buf))
        elif dt > slowest[0][0]:
            heapq.heapreplace(slowest, (dt, stats["tried"], buf))

    @hseed(seed)
    @settings(max_examples=min(seeds, n), deadline=None, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(strategy)
    def generated(buf: bytes) -> None:
        pool.append(buf)
        attempt(buf)

    t0 = time.perf_counter()
    generated()
    stats["generated"] = stats["tried"]
    rng = random.Random(seed)
    while stats["tried"] < n and pool:
        attempt(mutate(rng, rng.choice(pool), pool))
    stats["wall_s"] = time.perf_counter() - t0
    # The slowest inputs once more, alone (best of 5, garbage collector off): a single timing in
    # the run also holds collector pauses and the host's noise (shown as "observed").
    stats["observed_s"] = max(slowest)[0] if slowest else 0.0
    gc.collect()
    gc.disable()
    try:
        for _, _, buf in slowest:
            best = float("inf")
            for _ in range(5):
                t1 = time.thread_time()
                try:
                    check(buf)
                except Exception:  # noqa: BLE001 - already counted
                    pass
                best = min(best, time.thread_time() - t1)
            if best > stats["slowest_s"]:
                stats["slowest_s"], stats["slowest_len"] = best, len(buf)
    finally:
        gc.enable()
    return stats


def rss_mib() -> tuple[float, float]:
    """(RSS now, peak RSS) of this process in MiB."""
    with open("/proc/self/statm") as fh:
        now = int(fh.read().split()[1]) * resource.getpagesize()
    return now / 2**20, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=100_000, help="inputs per parser")
    ap.add_argument("--parser", choices=["kvblock", "front", "a1", "descriptor", "all"], default="all")
    ap.add_argument("--n-descriptor", type=int, default=20_000,
                    help="inputs for the descriptor loader (a schema validation each)")
    ap.add_argument("--seeds", type=int, default=5000, help="inputs drawn from the hypothesis strategies")
    ap.add_argument("--seed", type=int, default=int(time.time()))
    ap.add_argument("--out", type=Path, default=ROOT / ".cache" / "fuzz")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    # The parsers log each refusal (a warning per bad A1 request, ...): silenced for the run.
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.CRITICAL))
    logging.disable(logging.CRITICAL)
    runs = []
    if a.parser in ("kvblock", "all"):
        runs.append(("kvblock", st.one_of(kvblock_messages(), kvblock_mutants()), check_kvblock,
                     mutate_bytes, a.n))
    if a.parser in ("front", "all"):
        runs.append(("front", front_raw_bodies(), make_check_front(), mutate_json, a.n))
    if a.parser in ("a1", "all"):
        runs.append(("a1", a1_requests(), make_check_a1(), mutate_json, a.n))
    if a.parser in ("descriptor", "all"):
        runs.append(("descriptor", descriptor_files(), make_check_descriptor(), mutate_json,
                     a.n_descriptor))
    print(f"seed {a.seed}, {a.n} inputs per parser ({a.n_descriptor} descriptors), crashing "
          f"inputs to {a.out}", flush=True)
    for name, strategy, check, mutate, n in runs:
        s = fuzz(name, strategy, check, mutate, n, min(a.seeds, n), a.seed, a.out)
        now, peak = rss_mib()
        print(f"{name:10s}: tried {s['tried']} ({s['generated']} generated, the rest mutated), crashes {s['crashes']}, slowest input "
              f"{s['slowest_s'] * 1e3:.3f} ms CPU ({s['slowest_len']} B; observed in the run "
              f"{s['observed_s'] * 1e3:.1f} ms), {s['tried'] / s['wall_s']:.0f} inputs/s "
              f"(wall {s['wall_s']:.0f} s), RSS after {now:.0f} MiB (peak {peak:.0f} MiB)", flush=True)
        if s["first_crash"]:
            print("  first crash:", s["first_crash"], flush=True)


if __name__ == "__main__":
    main()

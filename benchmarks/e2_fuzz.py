"""Fuzz the xApp's whole E2 decode path with mutations of valid PDUs of every format.

    .venv/xapp/bin/python benchmarks/e2_fuzz.py [--n 100000] [--seed 1] [--crashes DIR]

Seeds: :func:`pallas_tools.tracegen.sample_pdus` (E2SM-RC header Formats 1-3 over SSB, CSI-RS-only,
per-beam and E-UTRA-neighbour MeasurementReports; E2SM-KPM v03.00/v02.03 message Formats 1-3)
plus the field cases under ../shared/cases/e2/ when present. Each input is a seed with 1-4
mutations, half of them inside one layer (E2SM header, E2SM message, or the RRC PDU of an RC
message copy) re-wrapped in a valid envelope, the others on the whole PDU (bit flips, byte overwrites, inserted or deleted runs, truncation, a length octet
bumped, a span duplicated, splices of two seeds), fed to an :class:`~xapp.e2.ingest.Ingestor`
over a TrackStore (E2AP, E2SM-RC/KPM, NR RRC decode with the seed's KPM version, then the
tracks). A crash is an exception out of ``Ingestor.on_indication`` or an "internal error" drop
(any exception other than the documented E2DecodeError/Dropped inside the decoders). Crashing inputs are written as hex
to ``--crashes`` (each becomes a regression test). Prints inputs tried, outcomes, crashes, the
slowest input's decode time (CPU seconds; its hex prefix, and the whole input in --crashes), and memory (peak and
final RSS) after the run.
"""

from __future__ import annotations

import argparse
from dataclasses import replace
import logging
import random
import resource
import time
from collections import Counter
from pathlib import Path

import structlog

from xapp.e2.e2ap import decode_ric_indication, e2ap_pdu
from xapp.e2.ie import E2DecodeError, e2sm_spec
from xapp.e2.rrc import lpp, ul_dcch
from xapp.e2.ingest import IngestConfig, Ingestor
from xapp.e2.sm_rc import decode_rc_message_copy
from pallas_tools.tracegen import encode_rc_message_copy, encode_ric_indication, sample_pdus
from xapp.tracks import TrackStore

CASES = Path(__file__).resolve().parents[1].parent / "shared" / "cases" / "e2"


def seeds() -> list[tuple[str, bytes]]:
    out = list(sample_pdus().items())
    if CASES.is_dir():
        out += [(p.stem, bytes.fromhex(p.read_text().strip())) for p in sorted(CASES.glob("*.hex"))]
    return out


def mutate(b: bytes, rng: random.Random, others: list[bytes]) -> bytes:
    """1-4 random mutations of ``b``."""
    x = bytearray(b)
    for _ in range(rng.randrange(1, 5)):
        op = rng.randrange(8)
        n = len(x)
        if n == 0:
            x += bytes([rng.randrange(256)])
            continue
        i = rng.randrange(n)
        if op == 0:
            x[i] ^= 1 << rng.randrange(8)
        elif op == 1:
            x[i] = rng.choice([0, 0xFF, 0x7F, 0x80, 0xC0, rng.randrange(256)])
        elif op == 2:
            x[i:i] = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 9)))
        elif op == 3:
            del x[i:i + rng.randrange(1, 9)]
        elif op == 4:
            del x[rng.randrange(n):]
        elif op == 5:
            x[i] = (x[i] + rng.choice([1, -1, 2, 64, 128])) & 0xFF
        elif op == 6:
            j = rng.randrange(i, min(n, i + 32) + 1)
            x[j:j] = x[i:j]
        else:
            o = rng.choice(others)
            k = rng.randrange(len(o) + 1)
            x = x[:i] + bytearray(o[k:])
    return bytes(x)


def _internal(ing: Ingestor) -> int:
    return sum(v for k, v in ing.stats.items() if k.startswith("dropped:internal error"))


class LayerMutator:
    """Structure-aware mutations: mutate one layer of a seed (the E2SM header, the E2SM message,
    or the NR RRC PDU inside an E2SM-RC message copy) and re-wrap it in a valid E2AP envelope
    (and message copy), so that the inner decoders see malformed input, not just E2AP."""

    def __init__(self, corpus: list[tuple[str, bytes]]) -> None:
        self.parts = {}
        for name, b in corpus:
            ind = decode_ric_indication(b)
            copy = None
            if ind.ran_function_id == 3:
                try:
                    copy = decode_rc_message_copy(ind.header, ind.message)
                except E2DecodeError:
                    copy = None
            self.parts[name] = (ind, copy)

    def __call__(self, name: str, rng: random.Random, others: list[bytes]) -> bytes:
        ind, copy = self.parts[name]
        which = rng.choice(("header", "message", "rrc") if copy is not None else ("header", "message"))
        if which == "rrc":
            h, m = encode_rc_message_copy(replace(copy, rrc=mutate(copy.rrc, rng, others)))
            return encode_ric_indication(replace(ind, header=h, message=m))
        return encode_ric_indication(replace(ind, **{which: mutate(getattr(ind, which), rng, others)}))


def config_for(name: str) -> IngestConfig:
    return IngestConfig(sm_versions={"*": {"kpm": "2.03"}}) if "v2.03" in name else IngestConfig()


def run(n: int, seed: int, crashes: Path | None = None) -> dict:
    rng = random.Random(seed)
    corpus = seeds()
    raw = [b for _, b in corpus]
    layered = LayerMutator(corpus)
    warm = Ingestor(TrackStore(), IngestConfig())
    for _, b in corpus:  # compile the ASN.1 modules and load pycrate's before timing anything
        warm.on_indication(b, "warm", 0.0)
    warm.on_indication(b"\x00\x05\x00\x00", "warm", 0.0)
    e2ap_pdu(), ul_dcch(), lpp(), e2sm_spec()  # every lazily loaded module (LPP: a malformed position)
    ing = {"*": Ingestor(TrackStore(max_ues=1000), IngestConfig()),
           "v2.03": Ingestor(TrackStore(max_ues=1000), config_for("v2.03"))}
    outcome: Counter[str] = Counter()
    crash_list: list[tuple[str, bytes, str]] = []
    slowest = (0.0, b"", "")
    for k in range(n):
        name, b = corpus[rng.randrange(len(corpus))]
        p = rng.random()
        x = b if p < 0.02 else layered(name, rng, raw) if p < 0.5 else mutate(b, rng, raw)
        g = ing["v2.03" if "v2.03" in name else "*"]
        internal_before = _internal(g)
        t0 = time.process_time()
        try:
            g.on_indication(x, "gnb", float(k))
        except Exception as e:  # noqa: BLE001 - a crash is what we are looking for
            crash_list.append((name, x, f"on_indication raised {type(e).__name__}: {e}"))
        dt = time.process_time() - t0
        if _internal(g) != internal_before:
            crash_list.append((name, x, "internal error drop (an exception other than the documented drop)"))
        if dt > slowest[0]:
            slowest = (dt, x, name)
    for g in ing.values():
        for key, v in g.stats.items():
            if key.startswith(("dropped:", "unused:", "rs:")):
                outcome[key.split(":")[0] + ":" + key.split(":", 1)[1][:40]] += v
        outcome["indications"] += g.stats["indications"]
        outcome["reports added"] += g.stats["reports"]
    internal = sum(_internal(i) for i in ing.values())
    # the slowest input again, alone (its first time may include a GC pause or a lazy import)
    again = []
    for _ in range(5):
        t0 = time.process_time()
        ing["v2.03" if "v2.03" in slowest[2] else "*"].on_indication(slowest[1], "gnb", float(n))
        again.append(time.process_time() - t0)
    rss_now = int(Path("/proc/self/statm").read_text().split()[1]) * resource.getpagesize() / 2**20
    if crashes is not None and crash_list:
        crashes.mkdir(parents=True, exist_ok=True)
        for i, (name, x, why) in enumerate(crash_list):
            (crashes / f"crash-{i:04d}-{name}.hex").write_text(x.hex() + "\n")
            (crashes / f"crash-{i:04d}-{name}.txt").write_text(why + "\n")
    if crashes is not None:
        crashes.mkdir(parents=True, exist_ok=True)
        (crashes / f"slowest-{slowest[2]}.hex").write_text(slowest[1].hex() + "\n")
    return {"inputs": n, "seeds": len(corpus), "outcomes": dict(outcome), "crashes": len(crash_list),
            "internal_error_drops": internal, "crash_reasons": Counter(w for _, _, w in crash_list).most_common(5),
            "slowest_cpu_s": slowest[0], "slowest_again_median_cpu_s": sorted(again)[2], "slowest_seed": slowest[2], "slowest_hex_prefix": slowest[1][:48].hex(),
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "rss_after_run_mib": rss_now, "tracked_ues": sum(len(i.store) for i in ing.values()),
            "kpm_value_ues": sum(len(i.kpm_values) for i in ing.values())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--crashes", type=Path, default=None, help="write crashing inputs here (hex)")
    a = ap.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.CRITICAL))  # drops are expected
    t0, c0 = time.perf_counter(), time.process_time()
    r = run(a.n, a.seed, a.crashes)
    r["cpu_s"], r["wall_s"] = time.process_time() - c0, time.perf_counter() - t0
    for k, v in r.items():
        print(f"{k}: {v}")


if __name__ == "__main__":
    main()

"""The UEs of a replay: one asyncio task per UE of the trace.

A UE streams LLM sessions from the agent of its serving cell (pallas_eval/client.py's UESession),
follows its handovers at the times the trace shows them (it switches to the new cell's agent
and resumes from the first token it has not received, naming the old agent as the origin so
the new one can relay while the session is not yet there, or for good under Detour), and
records every token's arrival time. When a session ends the UE starts the next one, drawn from
its own reproducible stream of session lengths (pallas_eval.lengths), so sessions are in flight
at handovers. Times are Unix seconds (``time.time()``), the clock the xApp and agents use.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator, Sequence

import httpx
import structlog

from pallas_eval.lengths import SessionSpec
from pallas_eval.metrics import SessionRecord
from pallas_common.aio import cancel_and_wait

log = structlog.get_logger("pallas.eval.ues")

#: Over how many seconds from the start of the drive the UEs open their first sessions, s.
FIRST_SESSION_SPREAD_S = 5.0


def first_session_delay(seed: int, ue_id: str, spread_s: float = FIRST_SESSION_SPREAD_S) -> float:
    """When a UE opens its first session after it appears, s: uniform in ``[0, spread_s)``,
    fixed per (seed, UE) so every scheme's run sees the same start. A cell's users do not all
    open a session in the same instant; without the spread every UE's first prompt is
    prefilled at once and the first handovers of the drive meet engines busy with all of them
    (issue 26). Raises ValueError for a negative spread."""
    if spread_s < 0:
        raise ValueError(f"spread_s must be >= 0, got {spread_s}")
    import zlib
    u = zlib.crc32(f"{seed}:{ue_id}".encode()) / 2 ** 32
    return spread_s * u


@dataclass
class UEPlan:
    """One UE's part of the trace in wall-clock time: when it appears, its serving cell over time
    (``cells``: (wall time, cell) at its first report and at every handover) and when it leaves."""

    ue_id: str
    start: float
    end: float
    cells: list[tuple[float, int]]


@dataclass
class UEOutcome:
    """What one UE saw: its sessions (with token times) and the session specs they came from."""

    ue_id: str
    sessions: list[SessionRecord] = field(default_factory=list)
    specs: dict[str, SessionSpec] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)


async def run_ue(plan: UEPlan, front_of_cell: Callable[[int], str], sessions: Iterator[SessionSpec], *,
                 scheme: str, http: httpx.AsyncClient, gap_s: float = 0.2, min_left_s: float = 2.0,
                 grace_s: float = 3.0, on_token: Callable[[], None] | None = None,
                 origin_of: Callable[[str], str] | None = None) -> UEOutcome:
    """Drive one UE through its plan; returns its outcome (never raises for a session's error:
    the error is recorded and the UE starts its next session).

    ``front_of_cell(cell)`` is the front URL of the agent serving that cell. A new session is not
    started less than ``min_left_s`` before the UE leaves the trace; a session still running
    ``grace_s`` after it left is cut there (its tokens so far are kept and checked).
    ``origin_of(front)``: the URL the new agent relays the old front through at a handover
    (default the front itself; the paper regime puts a delaying proxy there, pallas_eval.relay).
    """
    from pallas_eval.client import SessionError, UESession

    out = UEOutcome(plan.ue_id)
    cell_now = plan.cells[0][1]
    active: dict[str, UESession | None] = {"ue": None}
    lock = asyncio.Lock()

    async def sleep_until(t: float) -> None:
        d = t - time.time()
        if d > 0:
            await asyncio.sleep(d)

    async def follow_cells() -> None:
        nonlocal cell_now
        for t, cell in plan.cells[1:]:
            await sleep_until(t)
            async with lock:
                cell_now = cell
                ue = active["ue"]
                if ue is not None and not ue.finished:
                    try:
                        await ue.handover(front_of_cell(cell), relay=True,
                                          origin=origin_of(ue.url) if origin_of else None)
                        log.info("ue_handover", ue=plan.ue_id, cell=cell, session=ue.session_id,
                                 next_index=ue.next_index)
                    except Exception as e:  # noqa: BLE001 - recorded, the UE goes on
                        out.errors.append(f"handover at {t:.2f} to cell {cell}: {e!r}")

    async def run_sessions() -> None:
        await sleep_until(plan.start)
        while time.time() < plan.end - min_left_s:
            spec = next(sessions)
            async with lock:
                url = front_of_cell(cell_now)
                ue = UESession(url, ue_id=plan.ue_id, http=http)
                t_open = time.time()
                try:
                    await ue.open(prompt_token_ids=list(spec.prompt_ids), max_tokens=spec.max_tokens,
                                  temperature=0.0, ignore_eos=True, scheme=scheme)
                except Exception as e:  # noqa: BLE001
                    out.errors.append(f"open at {url}: {e!r}")
                    await asyncio.sleep(1.0)
                    continue
                active["ue"] = ue
            rec = SessionRecord(plan.ue_id, ue.session_id or "", len(spec.prompt_ids), spec.max_tokens, t_open)
            out.specs[rec.session_id] = spec
            out.sessions.append(rec)
            try:
                remaining = plan.end - time.time() + grace_s
                async with asyncio.timeout(max(1.0, remaining)):
                    async for tok in ue.tokens():
                        rec.times.append(tok.t)
                        rec.token_ids.append(tok.token_id)
                        rec.agents.append(tok.agent_id or "")
                        rec.relayed.append(tok.relayed_by or "")
                        if on_token:
                            on_token()
            except TimeoutError:
                rec.error = "stopped at the end of the replay"
            except (SessionError, Exception) as e:  # noqa: BLE001
                rec.error = repr(e)
                out.errors.append(f"session {rec.session_id}: {e!r}")
            finally:
                async with lock:
                    active["ue"] = None
                await ue.close()
            await asyncio.sleep(gap_s)

    cells_task = asyncio.create_task(follow_cells())
    try:
        await run_sessions()
    finally:
        await cancel_and_wait(cells_task)
    return out


async def run_ues(plans: Sequence[UEPlan], front_of_cell: Callable[[int], str],
                  session_streams: dict[str, Iterator[SessionSpec]], *, scheme: str,
                  on_token: Callable[[], None] | None = None,
                  origin_of: Callable[[str], str] | None = None) -> list[UEOutcome]:
    """Run every UE concurrently on one shared HTTP client; returns their outcomes in order."""
    limits = httpx.Limits(max_connections=64, max_keepalive_connections=16)
    async with httpx.AsyncClient(timeout=httpx.Timeout(None, connect=10.0), limits=limits) as http:
        return list(await asyncio.gather(*(run_ue(p, front_of_cell, session_streams[p.ue_id], scheme=scheme,
                                                  http=http, on_token=on_token, origin_of=origin_of)
                                             for p in plans)))

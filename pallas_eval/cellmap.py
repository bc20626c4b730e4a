"""Cells of a drive onto the few servers a machine can hold, so that neighbours never share one.

A real deployment has one edge server per gNB. Here two or three vLLM servers stand in for all
the cells of a drive; the map must give two cells between which a UE can hand over different
servers, so that every handover is a real migration between servers. That is a graph colouring:
cells are vertices, a handover seen in the trace is a hard edge (the two cells must differ), and a
serving/neighbour pair seen in a measurement report is a soft edge (kept apart when the colours
allow; those pairs are where a prediction can point). Solved exactly by backtracking in DSatur
order (drives have tens of cells), then soft conflicts are reduced by a greedy local search.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Iterable, Mapping


class ColouringError(ValueError):
    """The hard (handover) graph cannot be coloured with the servers given."""


def _backtrack(cells: list[int], adj: Mapping[int, set[int]], k: int, budget: int = 200_000) -> dict[int, int] | None:
    colour: dict[int, int] = {}
    steps = 0

    def pick() -> int:
        # DSatur: most distinct neighbour colours, then most neighbours, then smallest id.
        best, key = -1, None
        for c in cells:
            if c in colour:
                continue
            sat = len({colour[n] for n in adj[c] if n in colour})
            kk = (sat, len(adj[c]), -c)
            if key is None or kk > key:
                best, key = c, kk
        return best

    def solve() -> bool:
        nonlocal steps
        if len(colour) == len(cells):
            return True
        steps += 1
        if steps > budget:
            return False
        c = pick()
        used = {colour[n] for n in adj[c] if n in colour}
        for s in range(k):
            if s not in used:
                colour[c] = s
                if solve():
                    return True
                del colour[c]
        return False

    return dict(colour) if solve() else None


def map_cells_to_servers(cells: Iterable[int], handovers: Iterable[tuple[int, int]],
                         neighbours: Iterable[tuple[int, int]] = (), n_servers: int = 2) -> dict[int, int]:
    """Assign each cell a server index in [0, n_servers).

    ``handovers``: (from_cell, to_cell) pairs seen in the trace; these cells always get different
    servers. ``neighbours``: (serving, neighbour) pairs from measurement reports; kept apart when
    possible (fewest same-server pairs, weighted by how often the pair was seen).
    Raises ColouringError if the handover graph needs more servers than ``n_servers`` (for example
    three cells handing over to each other pairwise with two servers). Deterministic.
    """
    if n_servers < 1:
        raise ValueError("n_servers must be >= 1")
    hard: dict[int, set[int]] = defaultdict(set)
    allc: set[int] = set(int(c) for c in cells)
    for a, b in handovers:
        a, b = int(a), int(b)
        allc.update((a, b))
        if a != b:
            hard[a].add(b)
            hard[b].add(a)
    soft: dict[tuple[int, int], int] = defaultdict(int)
    for a, b in neighbours:
        a, b = int(a), int(b)
        allc.update((a, b))
        if a != b:
            soft[(min(a, b), max(a, b))] += 1
    order = sorted(allc)
    for c in order:
        hard.setdefault(c, set())
    colour = _backtrack(order, hard, n_servers)
    if colour is None:
        worst = max(order, key=lambda c: len(hard[c]))
        raise ColouringError(
            f"the drive's handover graph cannot be split over {n_servers} servers with no two "
            f"handover cells on one server (cell {worst} hands over with {sorted(hard[worst])}); "
            f"use more servers or a shorter segment")
    # Local search on soft conflicts, never breaking a hard edge.
    soft_adj: dict[int, dict[int, int]] = defaultdict(dict)
    for (a, b), w in soft.items():
        soft_adj[a][b] = w
        soft_adj[b][a] = w
    for _ in range(20):
        improved = False
        for c in order:
            here = sum(w for n, w in soft_adj[c].items() if colour[n] == colour[c])
            if here == 0:
                continue
            for s in range(n_servers):
                if s == colour[c] or any(colour[n] == s for n in hard[c]):
                    continue
                cost = sum(w for n, w in soft_adj[c].items() if colour[n] == s)
                if cost < here:
                    colour[c], here, improved = s, cost, True
        if not improved:
            break
    return colour


def shared_pairs(mapping: Mapping[int, int], pairs: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """The pairs (a, b) with a != b whose cells share a server under ``mapping``."""
    return sorted({(min(a, b), max(a, b)) for a, b in pairs
                   if a != b and mapping.get(a) is not None and mapping.get(a) == mapping.get(b)})

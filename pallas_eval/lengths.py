"""LLM session lengths drawn from real request lengths (Azure LLM inference trace 2023).

The bundled distribution holds only *numbers derived from* the Azure conversation trace
(``AzureLLMInferenceTrace_conv.csv``, 19,366 requests; Patel et al., Splitwise, ISCA 2024): the
empirical quantiles of ContextTokens and GeneratedTokens at the probabilities in ``_PROBS``,
computed with :func:`derive_quantiles` (numpy's linear percentile). No rows are copied. The two
lengths are drawn independently: their log-log correlation in the trace is 0.09.

With ``--azure FILE`` the harness draws whole (context, generated) rows from the CSV instead.
"""

from __future__ import annotations

import csv
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

# Probabilities (percent) of the bundled quantiles.
_PROBS = np.array([0, 1, 2.5, 5, 10, 15, 20, 25, 30, 35, 40, 45, 50, 55, 60, 65, 70, 75, 80, 85,
                   90, 95, 97.5, 99, 100], dtype=np.float64)
# Quantiles of ContextTokens (prompt length, tokens), Azure conv trace.
_CONTEXT_Q = np.array([2, 29, 120, 181, 207, 372, 387, 396, 403, 414, 703, 984, 1020, 1045, 1071,
                       1097, 1130, 1189, 1315, 1876, 2734, 4083, 4092, 4142, 14050], dtype=np.float64)
# Quantiles of GeneratedTokens (output length, tokens), Azure conv trace.
_GENERATED_Q = np.array([7, 16, 28, 41, 54, 67, 77, 85, 91, 96, 103, 113, 129, 151, 177, 217, 384,
                         395, 400, 411, 424, 451, 522, 601, 1000], dtype=np.float64)


def derive_quantiles(csv_path: str | Path, probs: np.ndarray = _PROBS) -> tuple[np.ndarray, np.ndarray]:
    """Quantiles (context, generated) of an Azure LLM trace CSV at ``probs`` (percent).

    This is how the bundled numbers were made; the unit test checks them against the real file.
    Raises ValueError if the file lacks the ContextTokens/GeneratedTokens columns.
    """
    ctx, gen = _read_azure(csv_path)
    return (np.round(np.percentile(ctx, probs)), np.round(np.percentile(gen, probs)))


def _read_azure(csv_path: str | Path) -> tuple[np.ndarray, np.ndarray]:
    with open(csv_path, newline="") as f:
        rd = csv.DictReader(f)
        if not rd.fieldnames or "ContextTokens" not in rd.fieldnames or "GeneratedTokens" not in rd.fieldnames:
            raise ValueError(f"{csv_path}: not an Azure LLM trace (needs ContextTokens, GeneratedTokens)")
        rows = [(int(r["ContextTokens"]), int(r["GeneratedTokens"])) for r in rd]
    if not rows:
        raise ValueError(f"{csv_path}: no requests")
    a = np.asarray(rows, dtype=np.int64)
    return a[:, 0], a[:, 1]


@dataclass(frozen=True)
class SessionSpec:
    """One UE session: the prompt as token ids and the number of tokens to generate (greedy)."""

    prompt_ids: tuple[int, ...]
    max_tokens: int

    @property
    def total_tokens(self) -> int:
        return len(self.prompt_ids) + self.max_tokens


class LengthSampler:
    """Draws (prompt length, output length) pairs, tokens.

    ``source=None`` uses the bundled quantiles (inverse-CDF sampling, piecewise linear between
    quantiles); a path draws whole rows of that Azure CSV uniformly. Lengths are clipped so that a
    session fits ``max_model_len`` (prompt + output <= max_model_len - 1) with an output of at
    least ``min_output`` and at most ``max_output`` tokens, and a prompt of at least one token.
    """

    def __init__(self, source: str | Path | None = None, *, max_model_len: int = 2048,
                 min_output: int = 16, max_output: int = 512) -> None:
        if max_model_len < min_output + 2:
            raise ValueError("max_model_len too small for min_output")
        self.source = str(source) if source else "bundled:azure-conv-2023-quantiles"
        self.max_model_len = max_model_len
        self.min_output = min_output
        self.max_output = max_output
        self._rows: tuple[np.ndarray, np.ndarray] | None = _read_azure(source) if source else None

    def draw(self, rng: np.random.Generator) -> tuple[int, int]:
        """One (prompt_tokens, output_tokens) pair, clipped to the model (see the class)."""
        if self._rows is None:
            u = rng.random(2) * 100.0
            ctx = float(np.interp(u[0], _PROBS, _CONTEXT_Q))
            gen = float(np.interp(u[1], _PROBS, _GENERATED_Q))
        else:
            i = int(rng.integers(len(self._rows[0])))
            ctx, gen = float(self._rows[0][i]), float(self._rows[1][i])
        out = int(np.clip(round(gen), self.min_output, self.max_output))
        out = min(out, self.max_model_len - 2)
        prompt = int(np.clip(round(ctx), 1, self.max_model_len - 1 - out))
        return prompt, out

    def session(self, rng: np.random.Generator, vocab_size: int, *, first_id: int = 3) -> SessionSpec:
        """A session with random prompt token ids in [first_id, vocab_size) (ids below are special)."""
        p, o = self.draw(rng)
        ids = rng.integers(first_id, vocab_size, size=p)
        return SessionSpec(tuple(int(x) for x in ids), o)


def ue_session_stream(seed: int, ue_id: str, sampler: LengthSampler, vocab_size: int):
    """An endless, reproducible sequence of SessionSpec for one UE.

    The same (seed, ue_id) gives the same sequence in every scheme's run, so the runs see the
    same inputs; a UE whose sessions end sooner under one scheme just draws fewer of them.
    """
    rng = np.random.default_rng([seed, zlib.crc32(ue_id.encode())])
    while True:
        yield sampler.session(rng, vocab_size)

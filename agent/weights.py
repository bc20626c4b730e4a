"""The identity of a model's weights, as the agent reports it (ModelIdentity.weights_digest):
two agents exchange KV blocks only when they serve the same weights.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

__all__ = ["weights_digest"]


def weights_digest(path: str | os.PathLike) -> str:
    """SHA-256 (hex) over the model's weight files, in name order (ModelIdentity.weights_digest).

    Cached in ``pallas-digest.txt`` beside the weights.
    """
    p = Path(path)
    cache = p / "pallas-digest.txt"
    if cache.exists():
        return cache.read_text().strip()
    h = hashlib.sha256()
    files = sorted(p.glob("*.safetensors")) or sorted(p.glob("*.bin"))
    for f in files:
        h.update(f.name.encode())
        with open(f, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 22), b""):
                h.update(chunk)
    digest = h.hexdigest()
    try:
        cache.write_text(digest)
    except OSError:
        pass
    return digest

"""Overlays on the xApp descriptor's ``controls``: profiles and single settings (issue 43).

A *profile* is a JSON object in the shape of the descriptor's ``controls`` holding only what it
changes, e.g. ``descriptors/profiles/drive-log.json`` (the predictor settings chosen on
G-NetTrack-like drive logs: 1 s rows, sparse GPS, one anonymous neighbour). A *setting* is one
``section.key[.key...]=VALUE`` with VALUE read as JSON (``true``, ``2``, ``0.5``, ``"a3"``) or,
when it is not JSON, as a string. Both are merged into a copy of the controls by
:func:`merge_controls`: nested objects merge key by key, anything else replaces. No schema is
applied here; the xApp validates the result at start (``xapp.config.validate_controls``) and
callers that can should validate before they start anything.

Pure: the standard library only, so both environments (the agent's and the xApp's) import it.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["PROFILES_DIR", "merge_controls", "load_profile", "parse_setting", "profile_path"]

#: The profiles shipped with the descriptor.
PROFILES_DIR = Path(__file__).resolve().parent.parent / "descriptors" / "profiles"


def merge_controls(base: Mapping[str, Any], overlay: Mapping[str, Any]) -> dict[str, Any]:
    """A deep copy of ``base`` with ``overlay`` merged in: where both hold an object at a key,
    the objects merge key by key (recursively); otherwise the overlay's value replaces."""
    out = copy.deepcopy(dict(base))
    for k, v in overlay.items():
        if isinstance(v, Mapping) and isinstance(out.get(k), Mapping):
            out[k] = merge_controls(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def profile_path(name_or_path: str) -> Path:
    """A profile's file: a path as given if it names a file, else ``PROFILES_DIR/<name>.json``.

    Raises ValueError naming the profiles there when neither exists."""
    p = Path(name_or_path)
    if p.is_file():
        return p
    shipped = PROFILES_DIR / f"{name_or_path}.json"
    if shipped.is_file():
        return shipped
    names = sorted(q.stem for q in PROFILES_DIR.glob("*.json"))
    raise ValueError(f"profile {name_or_path!r}: no such file, and not one of the shipped profiles {names}")


def load_profile(name_or_path: str) -> dict[str, Any]:
    """The controls overlay in a profile file (see :func:`profile_path`).

    Raises ValueError (naming the file) when it is not JSON or not an object of objects."""
    path = profile_path(name_or_path)
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"profile {path}: not readable as JSON ({exc})") from None
    if not isinstance(data, dict) or not all(isinstance(v, dict) for v in data.values()):
        raise ValueError(f"profile {path}: must be a JSON object of controls sections (objects)")
    return data


def parse_setting(expr: str) -> dict[str, Any]:
    """``"scheduler.targets_k=2"`` as ``{"scheduler": {"targets_k": 2}}``.

    The value is JSON where it parses as JSON, else the text itself. Raises ValueError for a
    missing ``=``, a key path with fewer than two parts or an empty part."""
    key, sep, raw = expr.partition("=")
    parts = key.strip().split(".")
    if not sep or len(parts) < 2 or not all(parts):
        raise ValueError(f"setting {expr!r}: expected section.key=VALUE (e.g. scheduler.targets_k=2)")
    try:
        value: Any = json.loads(raw)
    except json.JSONDecodeError:
        value = raw
    out: dict[str, Any] = {parts[-1]: value}
    for p in reversed(parts[:-1]):
        out = {p: out}
    return out

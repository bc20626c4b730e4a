"""Names that say the role (issue 44 item 4): no two modules of the deployables and their common
package share a file name, so ``engine.py`` or ``policy.py`` never means two things. A package's
own composition files (``app.py``, ``main.py``, ``config.py``) and ``__init__.py`` are the
exceptions. Standard library only: runs in both environments."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("agent", "xapp", "pallas_common")
ALLOWED = {"__init__.py", "app.py", "main.py", "config.py"}


def shared_names(root: Path, packages=PACKAGES, allowed=ALLOWED) -> dict[str, list[str]]:
    """File name -> the modules (paths relative to ``root``) that share it, for names used by
    more than one module and not in ``allowed``."""
    by: dict[str, list[str]] = defaultdict(list)
    for pkg in packages:
        for f in sorted((root / pkg).rglob("*.py")):
            if "__pycache__" not in f.parts and f.name not in allowed:
                by[f.name].append(str(f.relative_to(root)))
    return {n: v for n, v in by.items() if len(v) > 1}


def test_the_checker_finds_a_shared_name(tmp_path):
    for rel in ("agent/engine.py", "xapp/scheduler/engine.py", "xapp/app.py", "agent/app.py", "pallas_common/x.py"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("")
    assert shared_names(tmp_path) == {"engine.py": ["agent/engine.py", "xapp/scheduler/engine.py"]}


def test_no_two_modules_share_a_name():
    assert shared_names(ROOT) == {}

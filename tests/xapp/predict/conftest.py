"""Shared fixtures: where the real UCC drives are (the repository root's parent, ../shared)."""

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
UCC = REPO.parent / "shared" / "data" / "ucc-5g"


@pytest.fixture(scope="session")
def ucc_dir() -> Path:
    if not UCC.is_dir():
        pytest.skip(f"real drive data not found at {UCC}")
    return UCC

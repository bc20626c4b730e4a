"""Fixtures of the deployment tests."""

import json

import pytest

from deploy_paths import DESCRIPTORS


@pytest.fixture
def descriptor() -> dict:
    """A fresh copy of descriptors/config-file.json."""
    return json.loads((DESCRIPTORS / "config-file.json").read_text())


@pytest.fixture
def controls(descriptor) -> dict:
    """A fresh copy of the descriptor's controls section."""
    return descriptor["controls"]

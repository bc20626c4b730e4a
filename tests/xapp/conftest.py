"""Fixtures shared by the xApp's tests.

``redis_port``: a private redis-server (tests/xapp/redis_server.py) for one test module,
skipped only where the binary is absent; ``dbaas``: the environment an OSC xApp gets from the
RIC (``DBAAS_SERVICE_HOST`` / ``DBAAS_SERVICE_PORT``) pointing at it, for one test; ``sdl_ns``: a
fresh SDL namespace, so tests on one server never see each other's keys."""

from __future__ import annotations

import uuid

import pytest

from redis_server import redis_or_skip, redis_server


@pytest.fixture(scope="module")
def redis_port():
    redis_or_skip()
    with redis_server() as port:
        yield port


@pytest.fixture
def dbaas(redis_port, monkeypatch):
    """The environment an OSC xApp gets from the RIC, pointing at the private server."""
    monkeypatch.setenv("DBAAS_SERVICE_HOST", "127.0.0.1")
    monkeypatch.setenv("DBAAS_SERVICE_PORT", str(redis_port))
    return redis_port


@pytest.fixture
def sdl_ns():
    return f"pallas-test-{uuid.uuid4().hex[:8]}"

"""Fixtures shared by the source, patch and lock tests: real git servers and HTTP on 127.0.0.1."""

from __future__ import annotations

import pytest
from gitrepos import GitDaemon, HttpServer, make_upstream


@pytest.fixture
def upstream(tmp_path):
    """Upstream repositories with tags, several commits and nested submodules (tests/gitrepos.py)."""
    return make_upstream(tmp_path / "up")


@pytest.fixture
def daemon(upstream):
    """A real `git daemon` on 127.0.0.1 serving ``upstream``."""
    d = GitDaemon(upstream.served)
    yield d
    d.stop()


@pytest.fixture
def http(tmp_path):
    """A real HTTP server on 127.0.0.1 serving ``tmp_path/www``."""
    (tmp_path / "www").mkdir()
    server = HttpServer(tmp_path / "www")
    yield server
    server.close()

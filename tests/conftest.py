"""Test-wide setup: a private compilation cache so tests never touch the user's cache.
The fixture is per session, so each pytest-xdist worker (`-n auto`) has its own."""
import os
import tempfile

import pytest


@pytest.fixture(autouse=True, scope="session")
def _private_cache_dir():
    previous = os.environ.get("POLYTILE_CACHE_DIR")
    with tempfile.TemporaryDirectory(prefix="polytile-test-cache-") as path:
        os.environ["POLYTILE_CACHE_DIR"] = path
        yield path
    if previous is None:
        os.environ.pop("POLYTILE_CACHE_DIR", None)
    else:
        os.environ["POLYTILE_CACHE_DIR"] = previous

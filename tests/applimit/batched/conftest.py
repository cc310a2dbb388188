"""The contract suite again, on ``Limiter(..., batch=True)`` against the standalone
server: one thread at a time, every decision goes through the batching combiner's path
(``applimit/_batch.py``) and its write (``SyncWire.run_together``), including the recovery
after an error reply."""

from __future__ import annotations

from typing import Any

import pytest
from limiter_support import Driver, MakeLimiter


@pytest.fixture
def backend() -> str:
    """The standalone server only: on a cluster and in memory ``batch`` changes nothing."""
    return "standalone"


@pytest.fixture
def flavour() -> str:
    """``Limiter`` only: ``AsyncLimiter`` batches by itself."""
    return "sync"


@pytest.fixture
def make_limiter(make_limiter: MakeLimiter) -> MakeLimiter:
    """The contract suite's factory, every limiter built with ``batch=True``."""

    def make(text: str, **options: Any) -> Driver:
        driver = make_limiter(text, batch=True, **options)
        assert driver.limiter.batch
        return driver

    return make

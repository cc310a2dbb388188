"""Every contract test (``test_applimit_contract.py``), run on a batched ``Limiter``
(see this directory's conftest.py)."""

from test_applimit_contract import *  # noqa: F403  (the suite, collected again here)

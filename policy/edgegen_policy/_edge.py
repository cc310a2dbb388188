"""What an edge limit means, whatever carries it (a Cloudflare rule or the Worker).

Lint (L109, L110) and edgegen's placement and compiler read the same answer from here.
What Cloudflare's plans can express is edgegen's business (``edgegen/_capabilities.py``).
"""

from __future__ import annotations

from ._model import Limit, Policy
from ._vocab import MAX_LIMIT, Rate

# A credentialed_rate left out is this many times the rate, over the same period.
CREDENTIALED_FACTOR = 10


def credentialed_rate(policy: Policy, limit: Limit) -> Rate | None:
    """The per-IP rate for requests that carry a listed credential, or None.

    Only "unauthenticated only" limits of a policy that lists credentials have one: such
    requests are not exempt (the edge can only see that a credential is present, not that it
    is valid), they are counted apart at this looser rate. Default: ten times ``rate``.
    """
    edge = limit.edge
    when = policy.authenticated_when
    if edge is None or not edge.unauthenticated_only or not (when.headers or when.cookies):
        return None
    if edge.credentialed_rate is not None:
        return edge.credentialed_rate
    return Rate(min(edge.rate.limit * CREDENTIALED_FACTOR, MAX_LIMIT), edge.rate.period)

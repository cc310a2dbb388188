"""``edgegen show`` lists a tier's calendar quotas beside its rates."""

from __future__ import annotations

import edgegen_policy as policy

from edgegen._cli_policy import describe


def test_show_lists_quotas_and_their_time_zone() -> None:
    """Each tier's rates, then its quotas; the time zone when it is not UTC."""
    loaded = policy.loads(
        """
version: 1
tiers: [free, pro]
limits:
  - name: api
    app:
      algorithm: gcra
      tiers: {free: 10/1s, pro: [100/1s, 1000/1m]}
      quotas: {pro: {day: 20000, month: 500000}}
      quota_timezone: Europe/Berlin
"""
    )
    [row] = describe(loaded)
    assert row["app"] == (
        "gcra per user: free 10/1s, pro 100/1s + 1000/1m + 20000/day + 500000/month "
        "(quotas in Europe/Berlin)"
    )


def test_show_lists_concurrency_and_names_no_algorithm_without_rates() -> None:
    """A tier's requests at once follow its rates and quotas; a limit of concurrency alone
    names no algorithm and says nothing of a sliding window's wait."""
    loaded = policy.loads(
        """
version: 1
tiers: [free, pro]
limits:
  - name: api
    app: { tiers: { free: 10/1s }, concurrency: 3 }
  - name: exports
    app: { per: org, concurrency: { free: 1, pro: 4 } }
"""
    )
    api, exports = describe(loaded)
    assert api["app"] == "sliding_window per user: free 10/1s + 3 at once, pro 3 at once"
    assert exports["app"] == "per org: free 1 at once, pro 4 at once"
    assert "note" not in exports

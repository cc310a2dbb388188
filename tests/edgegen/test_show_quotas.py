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

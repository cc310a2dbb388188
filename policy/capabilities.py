"""Kept for importers of ``policy.capabilities.credentialed_rate``; use
``policy.credentialed_rate``.

What each Cloudflare plan can express, and where each edge limit runs, moved to edgegen
(``edgegen/_capabilities.py``, ``edgegen/_placement.py``): the policy package imports
nothing of edgegen, so this module cannot re-export them.
"""

from __future__ import annotations

from ._edge import CREDENTIALED_FACTOR, credentialed_rate

__all__ = ["CREDENTIALED_FACTOR", "credentialed_rate"]

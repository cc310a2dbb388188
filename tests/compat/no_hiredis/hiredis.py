"""Stands in for hiredis where ``make compat`` runs the contract suite without it.

Put first on PYTHONPATH, it makes ``import hiredis`` fail as on a machine where hiredis is
not installed: redis-py then parses replies in Python, and applimit packs commands itself.
"""

raise ImportError("hiredis is not installed (tests/compat/no_hiredis stands in for it)")

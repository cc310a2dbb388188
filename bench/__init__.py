"""Benchmarks of applimit against the physical floor and the best alternative.

Run them with ``make bench`` (or ``python -m bench.run``); see ``bench/run.py`` for the
options and ``docs/benchmarks.md`` for the latest results. Each benchmark is a module
with ``NAME``, ``TITLE`` and ``run(settings) -> Result``; ``bench/_common.py`` holds what
they share (servers, interleaved timing, the result model) and ``bench/_report.py`` turns
results into Markdown and a chart.
"""

"""Recorded traffic for a replay: the reader (files, formats told, merged by time), one
module per log format, tiers files, and the reader run in a background process."""

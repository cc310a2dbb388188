"""applimit: exact, shared, per-tier rate limits in Redis for Python apps."""

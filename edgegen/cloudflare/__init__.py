"""Cloudflare's API: the client and its one HTTP transport, retries, the token, error
wording, the analytics report, and the zone as the API reads it (``RemoteState``)."""

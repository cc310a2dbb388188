"""The web layer's private parts: framework-free and pure, no public names of its own.

The public modules stay where apps import them from (``applimit.asgi``, ``applimit.wsgi``,
``applimit.fastapi``, ``applimit.flask``, ``applimit.django``): thin shells over these.

- ``_request``: :class:`RequestInfo` (a request, from an ASGI scope or a WSGI environ),
  :class:`Caller` (who calls, as the app's ``identify`` says), running ``identify``;
- ``_client_ip``: :class:`TrustedProxies`, the client IP from the peer and the proxies;
- ``_headers``: the RateLimit headers and RFC 9457 problem documents a response carries;
- ``_gate``: :class:`Gate`, a decision to the answer to a request (headers or a refusal),
  and the app's hooks (exemptions, ``on_identify_error``, its own refusal body);
- ``_options``: the middleware's options checked at start-up, a request's cost;
- ``_views``: what the Flask and Django helpers share with the WSGI middleware;
- ``_decorator``: ``rate_limited``, a limit on a plain function, raising ``RateLimited``.
"""

"""A raw-socket HTTP/1.1 client: the request target goes on the wire byte for byte.

httpx and http.client validate or rewrite targets (they resolve, escape or refuse what the
corpus is made of), so requests are written by hand. One connection is kept alive across
requests and reopened when the server closes it (after a 400, or on ``Connection: close``).
"""

from __future__ import annotations

import socket
from dataclasses import dataclass, field

# A server that answers nothing within this many seconds is a failure of the run.
TIMEOUT = 10.0
MAX_HEAD = 64 * 1024
_QUICKACK: int | None = getattr(socket, "TCP_QUICKACK", None)


class NoAnswer(ConnectionError):
    """The server closed the connection without answering the request."""


@dataclass
class Response:
    """A response: status, header fields (lower-case names, in order) and body."""

    status: int
    headers: list[tuple[str, str]] = field(default_factory=list)
    body: bytes = b""

    def header(self, name: str) -> str | None:
        """The first value of a header, or None."""
        wanted = name.lower()
        return next((v for k, v in self.headers if k == wanted), None)


class RawClient:
    """Sends requests to one ``host:port`` over a keep-alive connection."""

    def __init__(self, host: str, port: int) -> None:
        """Remember the server; the connection opens with the first request."""
        self.address = (host, port)
        self._sock: socket.socket | None = None
        self._buffer = b""

    def close(self) -> None:
        """Close the connection, if open."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        self._buffer = b""

    def __enter__(self) -> RawClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def request(
        self, method: str, target: bytes, headers: list[tuple[str, str]] | None = None
    ) -> Response:
        """Send one request (no body) and read its response.

        A request on a kept-alive connection that the server had already closed is sent
        again once on a new connection; :class:`NoAnswer` when a fresh connection gets no
        answer either (the server refused the request line outright).
        """
        lines = [method.encode("ascii") + b" " + target + b" HTTP/1.1"]
        for name, value in headers or []:
            lines.append(name.encode("latin-1") + b": " + value.encode("latin-1"))
        if method.upper() in ("POST", "PUT", "PATCH"):
            lines.append(b"Content-Length: 0")
        data = b"\r\n".join(lines) + b"\r\n\r\n"
        for attempt in range(2):
            fresh = self._sock is None
            try:
                sock = self._connect()
                sock.sendall(data)
                response = self._read(sock, method)
            except (NoAnswer, ConnectionResetError, BrokenPipeError):
                self.close()
                if fresh or attempt:
                    raise NoAnswer(f"no answer to {data[:120]!r}") from None
                continue
            if (response.header("connection") or "").lower() == "close":
                self.close()
            return response
        raise AssertionError("unreachable")

    def _connect(self) -> socket.socket:
        if self._sock is None:
            self._sock = socket.create_connection(self.address, timeout=TIMEOUT)
            self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._buffer = b""
        return self._sock

    def _fill(self, sock: socket.socket) -> bool:
        if _QUICKACK is not None:
            # Acknowledge at once: a server that writes the head and the body apart (and
            # waits for the head's ACK before sending a small body) would otherwise wait for
            # Linux's delayed ACK, 40 ms per response.
            sock.setsockopt(socket.IPPROTO_TCP, _QUICKACK, 1)
        chunk = sock.recv(65536)
        if not chunk:
            return False
        self._buffer += chunk
        return True

    def _read_until(self, sock: socket.socket, marker: bytes) -> bytes:
        while marker not in self._buffer:
            if len(self._buffer) > MAX_HEAD:
                raise AssertionError(f"response head over {MAX_HEAD} bytes")
            if not self._fill(sock):
                raise NoAnswer("connection closed")
        head, _, self._buffer = self._buffer.partition(marker)
        return head

    def _read_exactly(self, sock: socket.socket, size: int) -> bytes:
        while len(self._buffer) < size:
            if not self._fill(sock):
                raise NoAnswer("connection closed in the body")
        data, self._buffer = self._buffer[:size], self._buffer[size:]
        return data

    def _read(self, sock: socket.socket, method: str) -> Response:
        head = self._read_until(sock, b"\r\n\r\n").decode("latin-1")
        status_line, *fields = head.split("\r\n")
        parts = status_line.split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1."):
            raise AssertionError(f"not an HTTP/1.x status line: {status_line!r}")
        response = Response(status=int(parts[1]))
        for line in fields:
            name, _, value = line.partition(":")
            response.headers.append((name.strip().lower(), value.strip()))
        # Methods are case-sensitive: "head" is not HEAD, and its answer has a body.
        if method == "HEAD" or response.status in (204, 304) or response.status < 200:
            return response
        if (response.header("transfer-encoding") or "").lower() == "chunked":
            body = b""
            while True:
                size = int(self._read_until(sock, b"\r\n").split(b";")[0], 16)
                if size == 0:
                    self._read_until(sock, b"\r\n")
                    break
                body += self._read_exactly(sock, size)
                self._read_exactly(sock, 2)
            response.body = body
        elif (length := response.header("content-length")) is not None:
            response.body = self._read_exactly(sock, int(length))
        else:
            while self._fill(sock):
                pass
            response.body, self._buffer = self._buffer, b""
            self.close()
        return response

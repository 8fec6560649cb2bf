"""The gateway's front door: limits on request heads that neither uvicorn nor httptools set.

uvicorn bounds the body only through the application and the idle time between requests
(``timeout_keep_alive``); with the httptools parser it reads a request line and headers of
any size for as long as a client takes to send them. :func:`front_protocol` subclasses
uvicorn's httptools protocol to bound the head's bytes, its number of headers and the time
it takes to arrive (from the connection or the request's first byte); the body's deadline
is the application's (``create_app(body_timeout_s=...)``).
"""

from __future__ import annotations

import asyncio
from typing import Any

from attrs import field, frozen
from attrs.validators import ge, instance_of, le

__all__ = ["FrontLimits", "front_protocol"]


def _positive_time(_inst: object, attribute: Any, value: float) -> None:
    if not (value > 0 and value < float("inf")):
        raise ValueError(f"'{attribute.name}' must be finite and > 0: {value!r}")


@frozen
class FrontLimits:
    """Bounds on what a client may send before the application sees its request."""

    max_header_bytes: int = field(default=16_384, validator=[instance_of(int), ge(256)])
    """Bytes of a request line and headers together (nginx's default buffers: 8-32 KB);
    more is answered 431 and the connection closed, as soon as a read shows it."""
    max_headers: int = field(default=100, validator=[instance_of(int), ge(1), le(10_000)])
    """Headers of one request (the same 431 beyond)."""
    header_timeout_s: float = field(default=10.0, converter=float, validator=_positive_time)
    """Seconds from a connection, or from a request's first byte, to the end of its head;
    a slower client is answered 408 and closed."""


_431 = (
    b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: text/plain\r\n"
    b"content-length: 28\r\nconnection: close\r\n\r\nRequest head is too large.\r\n"
)
_408 = (
    b"HTTP/1.1 408 Request Timeout\r\ncontent-type: text/plain\r\n"
    b"content-length: 26\r\nconnection: close\r\n\r\nRequest head is too slow.\r\n"
)


def front_protocol(limits: FrontLimits) -> type[asyncio.Protocol]:
    """uvicorn's httptools protocol with ``limits`` on request heads (pass it as
    ``uvicorn.Config(http=...)``)."""
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    if not isinstance(limits, FrontLimits):
        raise TypeError(f"'limits' must be FrontLimits: {limits!r}")

    class FrontProtocol(HttpToolsProtocol):
        """One client connection, its heads bounded by ``limits``."""

        _head_bytes = 0  # bytes received since the head began (the body's too, at its end)
        _head_size = 0  # of the request line and headers parsed
        _head_count = 0
        _in_head = True
        _too_big = False
        _head_timer: asyncio.TimerHandle | None = None
        _head_deadline = 0.0

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._start_head()

        def _start_head(self) -> None:
            # One timer per connection, not one per request: a head's start only moves the
            # deadline, and a timer that fires before it (set for an earlier head) is set
            # again for what remains.
            self._in_head = True
            self._head_bytes = self._head_size = self._head_count = 0
            self._head_deadline = self.loop.time() + limits.header_timeout_s
            if self._head_timer is None:
                self._head_timer = self.loop.call_at(self._head_deadline, self._head_late)

        def _head_late(self) -> None:
            self._head_timer = None
            if not self._in_head or self.transport.is_closing():
                return  # the head came in time: the next one sets its timer
            if self.loop.time() < self._head_deadline:  # a later head's: not yet
                self._head_timer = self.loop.call_at(self._head_deadline, self._head_late)
                return
            self._refuse(_408)

        def _refuse(self, answer: bytes) -> None:
            self._in_head = False
            self.transport.write(answer)
            self.transport.close()

        def connection_lost(self, exc: Exception | None) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            if self.transport.is_closing():
                return
            counting = self._in_head
            if counting:
                self._head_bytes += len(data)
            super().data_received(data)
            # Still in the head after this read: every byte counted was head.
            over = self._head_bytes > limits.max_header_bytes
            if counting and over and self._in_head and not self.transport.is_closing():
                self._refuse(_431)

        def send_400_response(self, msg: str) -> None:
            if self._too_big:
                self._refuse(_431)
            else:
                super().send_400_response(msg)

        def on_message_begin(self) -> None:
            if not self._in_head:  # the next request of a kept-alive connection
                self._start_head()
            super().on_message_begin()

        def on_url(self, url: bytes) -> None:
            self._head_size += len(url)
            if self._head_size > limits.max_header_bytes:
                self._too_big = True
                raise _HeadTooLargeError  # the parser stops; answered in send_400_response
            super().on_url(url)

        def on_header(self, name: bytes, value: bytes) -> None:
            self._head_count += 1
            self._head_size += len(name) + len(value) + 4
            if self._head_count > limits.max_headers or self._head_size > limits.max_header_bytes:
                self._too_big = True
                raise _HeadTooLargeError
            super().on_header(name, value)

        def on_headers_complete(self) -> None:
            self._in_head = False  # the timer, if it fires, finds nothing late
            super().on_headers_complete()

    return FrontProtocol


class _HeadTooLargeError(Exception):
    """Raised from a parser callback to stop reading a request head over the limits."""

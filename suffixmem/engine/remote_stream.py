"""The remote engine's HTTP side: replica URLs, one replica's SSE stream, why a replica failed.

Contract:
- ``check_url(url)`` accepts an ``http(s)://host[:port]`` base URL and gives it back without
  a trailing slash; anything else is a one-line ``ConfigError`` before any request is sent (a
  comma-separated string, a missing scheme, a port out of range).
- ``sse_chunks(client, url, body, ...)`` yields the JSON chunks of ``POST url/v1/completions``.
  The response is read by a daemon thread that hands its lines over a queue, so the caller's
  generator stays free while the socket is blocked: it gives up on the replica when
  ``is_down()`` says the replica was marked down (by the health check or another request) and
  nothing came for ``down_grace_s`` (a prefill under load is silent too, and one slow health
  probe must not cost it its work), or when nothing came for ``read_timeout_s``. A replica that
  keeps streaming is never given up on. Giving up, an error, and the caller closing the
  generator early shut the connection down (the replica sees the disconnect and aborts the
  request); a stream read to ``[DONE]`` or to its end ends normally. Lines reach the caller in
  the order the replica sent them. Give it a client that keeps no idle connections
  (``max_keepalive_connections=0``): a fresh connection's socket is known from its connect, so
  even a request whose answer never starts can be hung up on.
- Every way a replica can fail is ``ReplicaFailed`` with a one-line cause: a transport error, a
  5xx, an ``error`` event, an event that is not a JSON object, silence; the caller fails over.
  A 4xx is the request's own fault: ``InvalidRequestError`` with the server's message.
- ``cause(error)`` names what an httpx error means in a few words ("connection refused", "TLS
  handshake failed: ...", "host not found", ...).
"""

from __future__ import annotations

import contextlib
import json
import queue
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx

from suffixmem.engine.async_stream import ConsumerLeft, abandoned
from suffixmem.engine.driver import one_line
from suffixmem.errors import ConfigError, InvalidRequestError

__all__ = ["ReplicaFailed", "cause", "check_url", "server_message", "sse_chunks"]


class ReplicaFailed(Exception):
    """This replica failed mid-request; try the next one (the message is the cause)."""


def check_url(url: object) -> str:
    """``url`` as a replica base URL (no trailing slash); ``ConfigError`` when it is not one."""
    if not isinstance(url, str):
        raise ConfigError(f"a replica URL must be a string, got {type(url).__name__}")
    if "," in url:
        raise ConfigError(f"replica URL {url!r} holds a comma; give each replica as its own "
                          "list item")
    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL as e:
        raise ConfigError(f"replica URL {url!r} is not a valid URL: {one_line(e)}") from None
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise ConfigError(f"replica URL {url!r} is not an http(s) URL "
                          "(e.g. http://10.0.0.1:8000)")
    if parsed.port is not None and not 0 < parsed.port < 65536:
        raise ConfigError(f"replica URL {url!r} has port {parsed.port}, outside 1..65535")
    return url.rstrip("/")


def cause(error: BaseException) -> str:
    """What ``error`` (from httpx) says about the replica, in a few words."""
    text = one_line(error)
    low = text.lower()
    if isinstance(error, httpx.ConnectTimeout):
        return "connect timed out"
    if isinstance(error, httpx.ReadTimeout):
        return "no answer within the read timeout"
    if isinstance(error, httpx.ConnectError):
        if any(w in low for w in ("ssl", "tls", "certificate", "handshake")):
            return f"TLS handshake failed: {text}"
        if "refused" in low:
            return "connection refused"
        if any(w in low for w in ("name or service not known", "nodename nor servname",
                                  "name resolution", "no address associated")):
            return f"host not found: {text}"
        return f"cannot connect: {text}"
    return text


def server_message(response: httpx.Response) -> str:
    """The error message of a (read) error response, one line, at most 500 characters."""
    try:
        err = response.json().get("error", {})
        message = err.get("message") if isinstance(err, dict) else str(err)
    except (ValueError, AttributeError):
        message = response.text
    return " ".join(str(message or f"HTTP {response.status_code}").split())[:500]


_LINE, _END, _FAIL = "line", "end", "fail"


def sse_chunks(client: httpx.Client, url: str, body: dict[str, Any], *, read_timeout_s: float,
               is_down: Callable[[], bool], poll_s: float = 0.25,
               down_grace_s: float = 5.0) -> Iterator[dict[str, Any]]:
    """The replica's SSE chunks as dicts (see the module docstring)."""
    items: queue.Queue[tuple[str, Any]] = queue.Queue()
    stop = threading.Event()
    streams: list[Any] = []  # the connection's network stream, once connected
    reader = threading.Thread(target=_read, args=(client, url, body, items, stop, streams),
                              name="suffixmem-remote-read", daemon=True)
    reader.start()
    done = False
    last = time.monotonic()
    try:
        while True:
            try:
                kind, value = items.get(timeout=poll_s)
            except queue.Empty:
                # only a silent replica is given up on: one still streaming is evidently alive
                if abandoned():  # the server's client left: its turn ends, its lock frees
                    raise ConsumerLeft(f"the consumer left while {url} was silent") from None
                silent = time.monotonic() - last
                if silent >= down_grace_s and is_down():
                    raise ReplicaFailed("marked down while the request waited for it") from None
                if silent >= read_timeout_s:
                    raise ReplicaFailed(f"nothing received for {read_timeout_s:g} s") from None
                continue
            last = time.monotonic()
            if kind == _FAIL:
                raise value
            if kind == _END:  # without [DONE]: the caller judges by the finish reason
                done = True
                return
            if not value.startswith("data:"):
                continue
            data = value[5:].strip()
            if data == "[DONE]":
                done = True
                return
            try:
                chunk = json.loads(data)
            except ValueError:
                chunk = None
            if not isinstance(chunk, dict):
                raise ReplicaFailed(f"malformed event (not a JSON object): {data[:80]!r}")
            if "error" in chunk and "choices" not in chunk:
                raise ReplicaFailed(f"stream error: {' '.join(str(chunk['error']).split())}")
            yield chunk
            last = time.monotonic()  # the caller's own pace is no silence of the replica
    finally:
        stop.set()
        if not done:  # given up, failed, or closed early by the caller: hang up now
            _hang_up(streams)
            reader.join(timeout=2.0)


def _read(client: httpx.Client, url: str, body: dict[str, Any],
          items: queue.Queue[tuple[str, Any]], stop: threading.Event, streams: list[Any]) -> None:
    """Reader thread: the response's lines, then ``_END``; or one ``_FAIL`` with the error."""

    def trace(event: str, info: dict[str, Any]) -> None:
        # the connection's stream (TLS over TCP replaces TCP), so it can be shut down from the
        # caller's thread even before the answer's headers arrive
        if event in ("connection.connect_tcp.complete", "connection.start_tls.complete"):
            streams[:] = [info.get("return_value")]

    try:
        with client.stream("POST", f"{url}/v1/completions", json=body,
                           extensions={"trace": trace}) as r:
            if not streams:  # a pooled connection: no connect to trace
                streams.append(r.extensions.get("network_stream"))
            if r.status_code >= 500:
                items.put((_FAIL, ReplicaFailed(f"HTTP {r.status_code}")))
                return
            if r.status_code >= 400:
                r.read()
                items.put((_FAIL, InvalidRequestError(
                    f"replica {url} refused the request: {server_message(r)}")))
                return
            for line in r.iter_lines():
                if stop.is_set():
                    return
                items.put((_LINE, line))
        items.put((_END, None))
    except httpx.TransportError as e:
        if not stop.is_set():
            items.put((_FAIL, ReplicaFailed(cause(e))))
    except Exception as e:  # anything else reaches the caller as what it is
        items.put((_FAIL, e))


def _hang_up(streams: list[Any]) -> None:
    """Shut the connection's socket down: wakes the reader thread's blocked read, and the
    replica sees the disconnect (best effort: nothing to do before the connection exists)."""
    for stream in streams:
        with contextlib.suppress(Exception):
            sock = stream.get_extra_info("socket")
            if sock is not None:
                sock.shutdown(socket.SHUT_RDWR)

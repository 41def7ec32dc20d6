"""A fault-injecting HTTP proxy to put in front of the REAL vLLM server in tests.

It parses each request head, forwards the request to the upstream server on a fresh
connection (forcing `Connection: close`, so one request = one connection and faults are easy
to target) and relays the response bytes. Completion requests (POST /v1/completions) are
numbered 1, 2, ... and a `Fault` decides what happens to request n:

- "reset": relay `after_bytes` of the response, then abort both sockets with an RST
  (SO_LINGER 0) - a connection reset mid-stream;
- "http_500" / "http_429": answer with that status and a JSON error, never reaching upstream;
- "stall": relay `after_bytes`, then stop relaying for `stall_s` seconds (a read timeout).

Everything else (/v1/models, /metrics, /health) passes through untouched. Loopback only.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass

# s between relaying the last bytes and resetting the connection: long enough for a client
# sharing two busy cores with the server to read them (0.5 s lost them all once in CI)
RESET_GRACE_S = 2.0


@dataclass
class Fault:
    kind: str  # reset | http_500 | http_429 | stall
    after_bytes: int = 1500
    stall_s: float = 3.0


class FaultProxy:
    """Runs an asyncio proxy in a background thread; `url` is its base URL."""

    def __init__(self, upstream: str, decide: Callable[[int], Fault | None]):
        host_port = upstream.split("://", 1)[1].rstrip("/")
        self.up_host, up_port = host_port.split(":")
        self.up_port = int(up_port)
        self.decide = decide
        self.completions = 0
        self.injected: list[tuple[int, str]] = []
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        self._ready.wait(10)
        self.url = f"http://127.0.0.1:{self.port}"

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(
            asyncio.start_server(self._handle, "127.0.0.1", 0))
        self.port = self._server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()

    def close(self) -> None:
        async def stop() -> None:
            self._server.close()
            await self._server.wait_closed()

        asyncio.run_coroutine_threadsafe(stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            writer.close()
            return
        lines = head.decode("latin-1").split("\r\n")
        length = 0
        kept = [lines[0]]
        for h in lines[1:]:
            if not h:
                continue
            name = h.split(":", 1)[0].strip().lower()
            if name == "content-length":
                length = int(h.split(":", 1)[1])
            if name != "connection":
                kept.append(h)
        body = await reader.readexactly(length) if length else b""
        fault = None
        if lines[0].startswith("POST /v1/completions"):
            self.completions += 1
            fault = self.decide(self.completions)
        if fault is not None and fault.kind.startswith("http_"):
            self.injected.append((self.completions, fault.kind))
            code = int(fault.kind[5:])
            msg = b'{"error": "injected by the fault proxy"}'
            writer.write(f"HTTP/1.1 {code} Injected\r\nContent-Type: application/json\r\n"
                         f"Content-Length: {len(msg)}\r\nConnection: close\r\n\r\n"
                         .encode() + msg)
            await writer.drain()
            writer.close()
            return
        up_r, up_w = await asyncio.open_connection(self.up_host, self.up_port)
        up_w.write(("\r\n".join(kept) + "\r\nConnection: close\r\n\r\n").encode("latin-1")
                   + body)
        await up_w.drain()
        sent = 0
        try:
            while True:
                chunk = await up_r.read(4096)
                if not chunk:
                    break
                if fault is not None and sent + len(chunk) >= fault.after_bytes:
                    # counted when applied: a response shorter than after_bytes is not cut
                    self.injected.append((self.completions, fault.kind))
                    cut = max(0, fault.after_bytes - sent)
                    writer.write(chunk[:cut])
                    await writer.drain()
                    if fault.kind == "reset":
                        # An RST makes the peer's kernel drop what it has not yet read: give
                        # the client time to read the relayed tokens first, as a reset that
                        # comes mid-stream (not with the bytes) would.
                        await asyncio.sleep(RESET_GRACE_S)
                        _abort(writer)
                        _abort(up_w)
                        return
                    await asyncio.sleep(fault.stall_s)
                    chunk, fault = chunk[cut:], None
                writer.write(chunk)
                sent += len(chunk)
                await writer.drain()
        except ConnectionError:
            pass
        finally:
            up_w.close()
            writer.close()


def _abort(writer: asyncio.StreamWriter) -> None:
    """Close with an RST rather than a FIN."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
    writer.transport.abort()

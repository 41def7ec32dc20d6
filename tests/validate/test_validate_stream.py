"""The driver's streaming: a response is read to its end, so its connection is reused."""

from __future__ import annotations

import asyncio

import httpx

from rackSim.metrics.records import RequestRecord
from rackSim.validate.driver import DriverSettings, ReplayDriver
from rackSim.validate.workloads import cpu_tiny_workload
from rackSim.workload.sources import load_sessions


def test_requests_reuse_one_connection(tmp_path):
    """The driver reads each streamed response to its end, past `[DONE]`, so httpx returns the
    connection to its pool: three requests in a row open one connection (a response left
    unread closes its connection, and each request paid a new one: measured at sixteen lanes,
    ~1 ms of the driver's CPU per request). A minimal HTTP/1.1 server streams the events."""
    events = [b'data: {"choices": [{"token_ids": [5], "text": "a"}]}\n\n',
              b'data: {"choices": [{"token_ids": [6], "text": "b"}]}\n\n', b"data: [DONE]\n\n"]
    accepted: list[asyncio.StreamWriter] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(writer)
        while True:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError:  # the client closed the connection
                break
            length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length")))
            await reader.readexactly(length)
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                         b"transfer-encoding: chunked\r\n\r\n")
            for e in events:
                writer.write(b"%x\r\n%s\r\n" % (len(e), e))
            writer.write(b"0\r\n\r\n")
            await writer.drain()

    async def main() -> list[list[int]]:
        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        wl = cpu_tiny_workload(2)
        d = ReplayDriver(load_sessions(wl, 0), DriverSettings(endpoints=[url], replay=wl.replay),
                         tmp_path)
        got = []
        async with httpx.AsyncClient() as client:
            for _ in range(3):
                rec = RequestRecord(session_id="s", rid=0, lane=0, session_key=0, agent=0,
                                    send_s=0.0, prompt_tokens=1)
                generated: list[int] = []
                await d._stream(client, url, {"prompt": [1]}, rec, generated)
                assert rec.error is None and rec.output_tokens == 2
                got.append(generated)
        for w in accepted:
            w.close()
            await w.wait_closed()
        server.close()
        await server.wait_closed()
        return got

    assert asyncio.run(main()) == [[5, 6]] * 3
    assert len(accepted) == 1

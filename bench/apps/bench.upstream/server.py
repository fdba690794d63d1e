"""The benchmark's upstream: an asyncio protocol server on httptools (keep-alive, no framework)."""

from __future__ import annotations

import asyncio
import json
import os

import httptools
import uvloop

APP_ID = os.environ.get("OS_APP_ID", "bench.upstream")
INSTANCE_ID = os.environ.get("OS_INSTANCE_ID", "")
SMALL = b"s" * 200
LARGE = b"L" * 65536
HOOK = b'{"ok": true}'


def reply(body: bytes, content_type: bytes = b"application/octet-stream") -> bytes:
    return (b"HTTP/1.1 200 OK\r\nContent-Type: " + content_type + b"\r\nContent-Length: "
            + str(len(body)).encode() + b"\r\n\r\n" + body)


RESPONSES = {
    b"/api/data/small": reply(SMALL),
    b"/api/data/large": reply(LARGE),
    b"/health": reply(json.dumps({"appId": APP_ID, "instanceId": INSTANCE_ID}).encode(),
                      b"application/json"),
}
NOT_FOUND = b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n"


class Protocol(asyncio.Protocol):
    def __init__(self) -> None:
        self.parser = httptools.HttpRequestParser(self)
        self.url = b""
        self.transport: asyncio.WriteTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's TCPTransport

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            if self.transport:
                self.transport.close()

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_message_complete(self) -> None:
        path = self.url.split(b"?", 1)[0]
        self.url = b""
        if path.startswith(b"/api/lifecycle/"):
            response = (reply(b'{"path": "/"}') if path.endswith(b"onActivityCreate")
                        else reply(HOOK, b"application/json"))
        else:
            response = RESPONSES.get(path, NOT_FOUND)
        if self.transport:
            self.transport.write(response)


async def main() -> None:
    data_dir = os.environ.get("OS_DATA_DIR")
    if data_dir:  # the benchmark calls the shell as this app (bench.caller is a copy)
        with open(os.path.join(data_dir, "token"), "w") as token:  # noqa: PTH123, ASYNC230
            token.write(os.environ.get("OS_APP_TOKEN", ""))
    loop = asyncio.get_running_loop()
    server = await loop.create_server(Protocol, os.environ.get("OS_HOST", "127.0.0.1"),
                                      int(os.environ["OS_PORT"]), backlog=1024)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    uvloop.run(main())

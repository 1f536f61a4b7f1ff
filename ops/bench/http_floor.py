"""The HTTP floor: a server that does nothing but answer (``ops.bench.edges``, target 2).

    python -m ops.bench.http_floor ANSWERS_DIR

Listens on a free loopback port, prints ``floor http://127.0.0.1:PORT`` once it does,
and answers every ``POST /v1/NAME`` on a keep-alive connection with the bytes of
``ANSWERS_DIR/NAME`` (a real answer ``pulse up`` gave to that call): httptools parses
the request, the body is read and dropped, and the recorded answer goes out in one
write. Nothing is checked, decoded, called or encoded.

What it is for: the same client (``http.client``, one keep-alive connection), the same
loopback and the same bytes each way as the HTTP side of the edges benchmark, with no
work on the server's side. Its latency is what the transport alone adds to a call, so
``(in-process p50 + floor p50) / in-process p50`` is the least HTTP-over-in-process
ratio any server in Python could reach for that call on this machine. Runs until
stdin closes or it is terminated.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

import httptools


class Answering(asyncio.Protocol):
    """One connection: each complete request gets its route's recorded answer."""

    def __init__(self, answers: dict[bytes, bytes]) -> None:
        self.answers = answers
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.url = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            assert self.transport is not None
            self.transport.close()

    # httptools' callbacks
    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_message_complete(self) -> None:
        assert self.transport is not None
        answer = self.answers.get(self.url)
        self.url = b""
        if answer is None:
            self.transport.write(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n")
        else:
            self.transport.write(answer)


def load(directory: Path) -> dict[bytes, bytes]:
    """Each route's whole response (head and body), from the files in ``directory``."""
    answers = {}
    for path in sorted(directory.iterdir()):
        body = path.read_bytes()
        head = (
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\n\r\n"
        ).encode()
        answers[f"/v1/{path.name}".encode()] = head + body
    return answers


async def serve(directory: Path) -> None:
    answers = load(directory)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: Answering(answers), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    print(f"floor http://127.0.0.1:{port}", flush=True)
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    # the benchmark holds stdin open: its end (the benchmark gone) ends this server too
    stdin = sys.stdin.fileno()

    def read_stdin() -> None:
        if not os.read(stdin, 4096):
            stop.set()

    loop.add_reader(stdin, read_stdin)
    async with server:
        await stop.wait()


def main() -> int:
    if len(sys.argv) != 2 or not Path(sys.argv[1]).is_dir():
        print("usage: python -m ops.bench.http_floor ANSWERS_DIR", file=sys.stderr)
        return 2
    asyncio.run(serve(Path(sys.argv[1])))
    return 0


if __name__ == "__main__":
    sys.exit(main())

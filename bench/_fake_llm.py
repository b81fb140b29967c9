"""A local OpenAI-compatible chat completions server for the capture bench, in a process
of its own so that it never competes with the measured client for the interpreter.

It answers at once, from bytes made before it starts listening: a chat completion in one
write, or a stream of :data:`CHUNKS` chunk events (and ``data: [DONE]``) with chunked
transfer encoding, as the real API sends them. A request with an ``x-bench-pace`` header
has its stream's events written one by one, ``delay_ms`` apart, so that the time to the
first chunk and the time to the last differ by a known amount; otherwise the whole stream
is one write. Requests
are read by their ``content-length`` and never parsed beyond the ``stream`` flag.

    with FakeLLM(chunks=10, delay_ms=2.0) as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="bench")
        client.chat.completions.create(..., stream=True, extra_headers={"x-bench-pace": "1"})
"""

from __future__ import annotations

import asyncio
import json
import re
import select
import subprocess
import sys
from dataclasses import dataclass
from types import TracebackType
from typing import Self

CHUNKS = 10
"""Events of a streamed answer (one role chunk, content chunks, one finish chunk)."""

_STREAMED = re.compile(rb'"stream"\s*:\s*true')
_PACED = b"\r\nx-bench-pace:"
"""The request header that asks for a paced stream."""
_START_TIMEOUT_S = 30.0


@dataclass(frozen=True, slots=True)
class Answers:
    """The bytes the server writes, made once."""

    whole: bytes
    stream_head: bytes
    stream_events: tuple[bytes, ...]
    """Each event as one HTTP chunk, the terminating empty chunk last."""


def _completion() -> dict[str, object]:
    return {
        "id": "chatcmpl-bench",
        "object": "chat.completion",
        "created": 1764892800,
        "model": "gpt-4.1-mini",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "The order shipped on Monday."},
                "finish_reason": "stop",
                "logprobs": None,
            }
        ],
        "usage": {"prompt_tokens": 120, "completion_tokens": 7, "total_tokens": 127},
        "system_fingerprint": "fp_bench",
    }


def _chunk(delta: dict[str, object], finish: str | None) -> bytes:
    event = {
        "id": "chatcmpl-bench",
        "object": "chat.completion.chunk",
        "created": 1764892800,
        "model": "gpt-4.1-mini",
        "system_fingerprint": "fp_bench",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}],
    }
    return f"data: {json.dumps(event)}\n\n".encode()


def answers(chunks: int) -> Answers:
    """The server's answers, with ``chunks`` events in a stream (at least 2)."""
    body = json.dumps(_completion()).encode()
    whole = (
        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nx-request-id: req_bench\r\n"
        + f"content-length: {len(body)}\r\n\r\n".encode()
        + body
    )
    events = [_chunk({"role": "assistant", "content": ""}, None)]
    events += [_chunk({"content": f"word{i} "}, None) for i in range(chunks - 2)]
    events += [_chunk({}, "stop"), b"data: [DONE]\n\n"]
    framed = (*(f"{len(e):x}\r\n".encode() + e + b"\r\n" for e in events), b"0\r\n\r\n")
    head = (
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nx-request-id: req_bench\r\n"
        b"transfer-encoding: chunked\r\n\r\n"
    )
    return Answers(whole, head, framed)


async def _serve_connection(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, made: Answers, delay_s: float
) -> None:
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = re.search(rb"(?im)^content-length:\s*(\d+)", head)
            body = await reader.readexactly(int(length.group(1)) if length else 0)
            if not _STREAMED.search(body):
                writer.write(made.whole)
            elif _PACED in head.lower():
                await _paced(writer, made, delay_s)
            else:
                writer.write(made.stream_head + b"".join(made.stream_events))
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass  # the client closed its connection
    finally:
        writer.close()


async def _paced(writer: asyncio.StreamWriter, made: Answers, delay_s: float) -> None:
    writer.write(made.stream_head + made.stream_events[0])
    await writer.drain()
    for event in made.stream_events[1:-3]:
        await asyncio.sleep(delay_s)
        writer.write(event)
        await writer.drain()
    await asyncio.sleep(delay_s)
    writer.write(b"".join(made.stream_events[-3:]))  # the finish chunk, [DONE], the end


async def _main(chunks: int, delay_ms: float) -> None:
    made = answers(chunks)

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _serve_connection(reader, writer, made, delay_ms / 1000.0)

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    print(server.sockets[0].getsockname()[1], flush=True)  # the parent waits for the port
    async with server:
        await server.serve_forever()


class FakeLLM:
    """The server in a child process (this file run as a script: it imports nothing but
    the standard library); a context manager that stops it on exit.

    Args:
        chunks: events of a streamed answer.
        delay_ms: the pause between two events of a paced stream.
    """

    def __init__(self, *, chunks: int = CHUNKS, delay_ms: float = 2.0) -> None:
        if chunks < 2:
            raise ValueError(f"a stream needs at least 2 chunks, not {chunks}")
        self.chunks = chunks
        self.delay_ms = delay_ms
        self.port = 0
        self._process: subprocess.Popen[str] | None = None

    @property
    def base_url(self) -> str:
        """The SDK's base URL."""
        return f"http://127.0.0.1:{self.port}/v1"

    def __enter__(self) -> Self:
        command = [sys.executable, __file__, str(self.chunks), str(self.delay_ms)]
        self._process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
        assert self._process.stdout is not None
        ready, _, _ = select.select([self._process.stdout], [], [], _START_TIMEOUT_S)
        line = self._process.stdout.readline() if ready else ""
        if not line.strip().isdigit():
            self._stop()
            raise RuntimeError(f"the fake LLM server did not start in {_START_TIMEOUT_S:.0f}s")
        self.port = int(line)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop()

    def _stop(self) -> None:
        if self._process is None:
            return
        self._process.terminate()
        try:
            self._process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        if self._process.stdout is not None:
            self._process.stdout.close()


if __name__ == "__main__":
    asyncio.run(_main(int(sys.argv[1]), float(sys.argv[2])))

"""An HTTP transport for the openai backend that bounds each response's decoded size.

The transport decodes the body itself (gzip, deflate: all it asks for) in bounded pieces and counts
the decoded bytes as they arrive; past `max_bytes` it stops reading and raises ResponseRefused. A
gzip bomb (1 MB on the wire, 1 GB unpacked) thus costs at most `max_bytes` of memory per request,
never the whole unpacked body. A body in another encoding than asked for is refused the same way.
"""
from __future__ import annotations

import zlib
from typing import Any, AsyncIterator, Callable, Iterator

import httpx2
import openai

# decoded in pieces of at most this many bytes, so one small compressed chunk cannot inflate at once
PIECE = 1 << 20
DECODERS: dict[str, Callable[[], Any]] = {  # zlib decompressors
    "gzip": lambda: zlib.decompressobj(16 + zlib.MAX_WBITS),
    "deflate": lambda: zlib.decompressobj(zlib.MAX_WBITS),
}


class ResponseRefused(openai.OpenAIError):
    """A response too large or in an encoding not asked for. An OpenAIError, so the client neither
    retries it nor hides it behind "Connection error"."""


def _pieces(decoder: Any, data: bytes, encoding: str | None) -> Iterator[bytes]:
    """`data` decoded, one piece of at most PIECE bytes at a time (a generator: a 64 KB chunk of a
    bomb unpacks to 64 MB, which must never be held at once)."""
    if decoder is None:
        yield data
        return
    try:
        piece = decoder.decompress(data, PIECE)
        while piece:
            yield piece
            piece = decoder.decompress(decoder.unconsumed_tail, PIECE)
    except zlib.error as exc:
        raise ResponseRefused(f"the {encoding} body does not decode ({exc})") from None


class CappedStream(httpx2.AsyncByteStream):
    """The decoded body of `raw`, raising ResponseRefused once more than max_bytes have come."""

    def __init__(self, raw: httpx2.AsyncByteStream, encoding: str | None, max_bytes: int):
        self.raw, self.encoding, self.max_bytes = raw, encoding, max_bytes

    async def __aiter__(self) -> AsyncIterator[bytes]:
        decoder = DECODERS[self.encoding]() if self.encoding else None
        total = 0
        async for chunk in self.raw:
            for piece in _pieces(decoder, chunk, self.encoding):
                total += len(piece)
                if total > self.max_bytes:
                    raise ResponseRefused(f"the response is larger than backend.max_response_bytes={self.max_bytes} "
                                          "once decoded; the rest was not read")
                yield piece

    async def aclose(self) -> None:
        await self.raw.aclose()


class CappedTransport(httpx2.AsyncBaseTransport):
    """`inner` (the real connection pool, or a test's mock) with every response's body capped."""

    def __init__(self, inner: httpx2.AsyncBaseTransport, max_bytes: int):
        self.inner, self.max_bytes = inner, max_bytes

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        request.headers["Accept-Encoding"] = ", ".join(DECODERS)  # only what is decoded here, under the cap
        response = await self.inner.handle_async_request(request)
        codings = [c.strip().lower() for c in response.headers.get("content-encoding", "").split(",")]
        codings = [c for c in codings if c not in ("", "identity")]
        if len(codings) > 1 or (codings and codings[0] not in DECODERS):
            await response.aclose()
            raise ResponseRefused(f"the response's content-encoding {', '.join(codings)!r} was not asked for")
        # decoded here: the client above sees a plain body, its length unknown until read
        headers = [(k, v) for k, v in response.headers.raw if k.lower() not in (b"content-encoding", b"content-length")]
        return httpx2.Response(response.status_code, headers=headers, extensions=response.extensions,
                               stream=CappedStream(response.stream, codings[0] if codings else None, self.max_bytes))

    async def aclose(self) -> None:
        await self.inner.aclose()

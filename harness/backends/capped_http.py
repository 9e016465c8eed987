"""An HTTP transport for the API backends that bounds each response's decoded size and keeps its text.

The transport decodes the body itself (gzip, deflate: all it asks for) in bounded pieces and counts
the decoded bytes as they arrive; past `max_bytes` it stops reading and raises the backend's refusal
error. A gzip bomb (1 MB on the wire, 1 GB unpacked) thus costs at most `max_bytes` of memory per
request, never the whole unpacked body. A body in another encoding than asked for is refused the same way.

Every body statusbench reads from a server is text (JSON, server-sent events, JSONL result files), so
bytes that are not UTF-8 become U+FFFD here, as they arrive: an answer with one bad byte is kept
(marked where the byte was), not lost to a JSON decode error.
"""
from __future__ import annotations

import codecs
import zlib
from typing import Any, AsyncIterator, Callable, Iterator

import httpx2

# decoded in pieces of at most this many bytes, so one small compressed chunk cannot inflate at once
PIECE = 1 << 20
DECODERS: dict[str, Callable[[], Any]] = {  # zlib decompressors
    "gzip": lambda: zlib.decompressobj(16 + zlib.MAX_WBITS),
    "deflate": lambda: zlib.decompressobj(zlib.MAX_WBITS),
}


class ResponseRefused(Exception):
    """A response too large or in an encoding not asked for. Each backend raises it as a subclass of
    its SDK's own base error too (`refusal`), so the client neither retries it nor hides it behind
    "Connection error"."""


def refusal(sdk_error: type[Exception]) -> type[ResponseRefused]:
    """ResponseRefused as an error of the SDK whose client reads the response."""
    return type("ResponseRefused", (ResponseRefused, sdk_error), {})


def _pieces(decoder: Any, data: bytes, encoding: str | None, refused: type[Exception]) -> Iterator[bytes]:
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
        raise refused(f"the {encoding} body does not decode ({exc})") from None


class CappedStream(httpx2.AsyncByteStream):
    """The decoded body of `raw` as valid UTF-8, raising `refused` once more than max_bytes have come."""

    def __init__(self, raw: httpx2.AsyncByteStream, encoding: str | None, max_bytes: int, refused: type[Exception]):
        self.raw, self.encoding, self.max_bytes, self.refused = raw, encoding, max_bytes, refused

    async def __aiter__(self) -> AsyncIterator[bytes]:
        decoder = DECODERS[self.encoding]() if self.encoding else None
        # incremental: a character split across two chunks is joined, not replaced
        text = codecs.getincrementaldecoder("utf-8")(errors="replace")
        total = 0
        async for chunk in self.raw:
            for piece in _pieces(decoder, chunk, self.encoding, self.refused):
                total += len(piece)
                if total > self.max_bytes:
                    raise self.refused(f"the response is larger than backend.max_response_bytes={self.max_bytes} "
                                       "once decoded; the rest was not read")
                yield text.decode(piece).encode("utf-8")
        tail = text.decode(b"", final=True)  # a body cut inside a character: its bytes are one U+FFFD
        if tail:
            yield tail.encode("utf-8")

    async def aclose(self) -> None:
        await self.raw.aclose()


class CappedTransport(httpx2.AsyncBaseTransport):
    """`inner` (the real connection pool, or a test's mock) with every response's body capped and
    made valid UTF-8; `refused`: the error raised (ResponseRefused as the SDK's error, `refusal`)."""

    def __init__(self, inner: httpx2.AsyncBaseTransport, max_bytes: int, refused: type[Exception] = ResponseRefused):
        self.inner, self.max_bytes, self.refused = inner, max_bytes, refused

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        request.headers["Accept-Encoding"] = ", ".join(DECODERS)  # only what is decoded here, under the cap
        response = await self.inner.handle_async_request(request)
        codings = [c.strip().lower() for c in response.headers.get("content-encoding", "").split(",")]
        codings = [c for c in codings if c not in ("", "identity")]
        if len(codings) > 1 or (codings and codings[0] not in DECODERS):
            await response.aclose()
            raise self.refused(f"the response's content-encoding {', '.join(codings)!r} was not asked for")
        # decoded here: the client above sees a plain body, its length unknown until read
        headers = [(k, v) for k, v in response.headers.raw if k.lower() not in (b"content-encoding", b"content-length")]
        return httpx2.Response(response.status_code, headers=headers, extensions=response.extensions,
                               stream=CappedStream(response.stream, codings[0] if codings else None, self.max_bytes,
                                                   self.refused))

    async def aclose(self) -> None:
        await self.inner.aclose()

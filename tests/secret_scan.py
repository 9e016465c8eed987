"""Finding an API key in what statusbench wrote, in any shape a server or a model may echo it in.

The scan decodes rather than encodes: it reads every file under a folder (a parquet file as its
values, a zip or .npz as its members), undoes JSON and HTML escapes, and looks for any run of 12
consecutive characters of the key as is, reversed, percent-decoded, with every character but letters
and digits dropped (a key spelled out with separators), and inside every base64/base64url or hex run
decoded at each offset. It shares no code with harness.io.secrets, so it checks the redaction
instead of repeating it.
"""
from __future__ import annotations

import base64
import binascii
import html
import json
import re
import urllib.parse
import zipfile
from pathlib import Path

RUN = 12  # consecutive characters of the key that count as the key (harness.io.secrets.MIN_RUN)
_B64_RUN = re.compile(r"[A-Za-z0-9+/_-]{16,}")
_HEX_RUN = re.compile(r"[0-9A-Fa-f]{24,}")
_ESCAPE = re.compile(r"\\(u[0-9a-fA-F]{4}|[nrtbf\"\\/])")
_ESCAPES = {"n": "\n", "r": "\r", "t": "\t", "b": "\b", "f": "\f", '"': '"', "\\": "\\", "/": "/"}


def _pieces(key: str) -> set[str]:
    return {key[i:i + RUN] for i in range(len(key) - RUN + 1)}


def _letters_and_digits(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]", "", text)


def _unescaped(text: str) -> str:
    """JSON string escapes undone (`\\n`, `\\u003c`), as a browser's JSON data or a JSONL line holds them."""
    return _ESCAPE.sub(lambda m: chr(int(m.group(1)[1:], 16)) if m.group(1)[0] == "u" else _ESCAPES[m.group(1)], text)


def _base64_decoded(text: str) -> list[str]:
    """Every run of base64 characters (line breaks removed first: MIME wraps at 76) decoded from
    each of the 4 character offsets, standard and URL-safe alphabets alike."""
    out = []
    for run in _B64_RUN.findall(re.sub(r"\s+", "", text)):
        run = run.replace("-", "+").replace("_", "/")
        for offset in range(4):
            chunk = run[offset:]
            chunk = chunk[:len(chunk) // 4 * 4]
            try:
                out.append(base64.b64decode(chunk, validate=True).decode("latin-1"))
            except (binascii.Error, ValueError):
                continue
    return out


def _hex_decoded(text: str) -> list[str]:
    return [bytes.fromhex(run[offset:][:len(run[offset:]) // 2 * 2]).decode("latin-1")
            for run in _HEX_RUN.findall(re.sub(r"[\s:]+", "", text)) for offset in range(2)]


def key_shapes(text: str, key: str) -> list[str]:
    """The names of the shapes in which RUN consecutive characters of `key` occur in `text`."""
    pieces, stripped = _pieces(key), _pieces(_letters_and_digits(key))
    found = []
    for variant in dict.fromkeys([text, _unescaped(text), html.unescape(text)]):
        checks = {"plain": [variant], "reversed": [variant[::-1]], "percent-encoded": [urllib.parse.unquote(variant)],
                  "base64": _base64_decoded(variant), "hex": _hex_decoded(variant)}
        found += [name for name, texts in checks.items() if any(p in t for t in texts for p in pieces)]
        if any(p in _letters_and_digits(variant) for p in stripped):
            found.append("spelled out with separators")
    return sorted(set(found))


def file_texts(path: Path) -> list[str]:
    """What a file holds as text: a parquet file's values, a zip's members, else its bytes."""
    data = path.read_bytes()
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        return [json.dumps(pq.read_table(path).to_pylist(), ensure_ascii=False, default=str)]
    if data[:4] == b"PK\x03\x04":
        with zipfile.ZipFile(path) as z:
            return [z.read(name).decode("utf-8", "replace") for name in z.namelist()]
    return [data.decode("utf-8", "replace")]


def key_leaks(root: Path, key: str) -> list[str]:
    """`path: shape` for every regular file under root holding the key in some shape."""
    return [f"{path}: {shape}" for path in sorted(Path(root).rglob("*")) if path.is_file() and not path.is_symlink()
            for text in file_texts(path) for shape in key_shapes(text, key)]

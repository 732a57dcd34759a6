"""Reading an Export JSON file piece by piece, never whole.

An export is one JSON object: `{"format", "version", "session", "envelopes": [...]}`
(and, when it carries media, `"media": [...]`). `ExportReader.items()` walks that object
and yields each top-level key with its value, except the lists `envelopes` and `media`,
whose items it yields one at a time (keys `ENVELOPE` and `MEDIA`), each decoded
with `json.JSONDecoder.raw_decode` from a buffer that holds the unread part of the file
read so far. Memory therefore follows the largest single item, not the file; the
file's size is capped (`max_bytes`, counted as it is read, so a pipe or a growing file
is capped too).

Whatever is not an export of that shape (bad UTF-8, bad JSON, NaN, a key twice, data
after the object, nesting too deep for the decoder) is refused with ValidationFailed
naming where and why.
"""

from __future__ import annotations

import codecs
import json
from collections.abc import Iterator
from typing import IO, Any

from sectr.errors import ValidationFailed

#: The key `items()` yields each envelope record under.
ENVELOPE = "envelopes"
#: The key `items()` yields each carried medium under (an export with media).
MEDIA = "media"
#: The lists read item by item.
STREAMED = (ENVELOPE, MEDIA)
CHUNK_BYTES = 1 << 16
_WHITESPACE = " \t\n\r"


def _refuse_constant(name: str) -> None:
    raise ValueError(f"{name} is not a JSON number")


_DECODER = json.JSONDecoder(parse_constant=_refuse_constant)


def refused(reason: str) -> ValidationFailed:
    return ValidationFailed(reason, code="invalid_import")


def too_large(max_bytes: int) -> ValidationFailed:
    return refused(f"the file is larger than the import limit of {max_bytes} bytes (SECTR_IMPORT_MAX_BYTES)")


class ExportReader:
    def __init__(self, handle: IO[bytes], *, max_bytes: int, chunk_bytes: int = CHUNK_BYTES) -> None:
        self.handle = handle
        self.max_bytes = max_bytes
        self.chunk_bytes = chunk_bytes
        self._decoder = codecs.getincrementaldecoder("utf-8")("strict")
        self.text = ""  # the part of the file read and not yet consumed starts at pos
        self.pos = 0
        self.offset = 0  # characters consumed and dropped from `text`
        self.bytes_read = 0
        self.eof = False

    # ---- the buffer ----

    def _read(self, size: int) -> None:
        """Append up to `size` more bytes' text (sets eof at the end of the file)."""
        if self.eof:
            return
        if self.pos:  # drop what is consumed, so the buffer holds one value at most
            self.offset += self.pos
            self.text = self.text[self.pos :]
            self.pos = 0
        data = self.handle.read(size)
        self.bytes_read += len(data)
        if self.bytes_read > self.max_bytes:
            raise too_large(self.max_bytes)
        try:
            self.text += self._decoder.decode(data, final=not data)
        except UnicodeDecodeError:
            raise refused(f"the file is not UTF-8 text (near byte {self.bytes_read - len(data)})") from None
        if not data:
            self.eof = True

    def _peek(self) -> str:
        """The next character after whitespace ("" at the end of the file)."""
        while True:
            text, pos = self.text, self.pos
            while pos < len(text) and text[pos] in _WHITESPACE:
                pos += 1
            self.pos = pos
            if pos < len(text):
                return text[pos]
            if self.eof:
                return ""
            self._read(self.chunk_bytes)

    def _expect(self, chars: str, what: str) -> str:
        char = self._peek()
        if not char or char not in chars:
            found = repr(char) if char else "the end of the file"
            raise refused(f"expected {what} at character {self.offset + self.pos}, found {found}")
        self.pos += 1
        return char

    def _value(self) -> Any:
        self._peek()
        size = self.chunk_bytes
        while True:
            try:
                value, end = _DECODER.raw_decode(self.text, self.pos)
            except json.JSONDecodeError as exc:
                if self.eof:
                    raise refused(f"not valid JSON at character {self.offset + exc.pos}: {exc.msg}") from None
            except RecursionError:
                raise refused(f"a value at character {self.offset + self.pos} nests too deep") from None
            except ValueError as exc:  # NaN, Infinity
                raise refused(f"not valid JSON near character {self.offset + self.pos}: {exc}") from None
            else:
                # A value that ends where the buffer ends may go on (a number cut in two).
                if end < len(self.text) or self.eof:
                    self.pos = end
                    return value
            # Incomplete so far: read more, twice as much each time (one parse per doubling).
            self._read(size)
            size *= 2

    # ---- the export's shape ----

    def items(self) -> Iterator[tuple[str, Any]]:
        """(key, value) for each top-level key; (ENVELOPE, record) for each envelope."""
        self._expect("{", "an export (a JSON object)")
        seen: set[str] = set()
        if self._peek() == "}":
            self.pos += 1
        else:
            while True:
                if self._peek() != '"':
                    self._expect('"', "a key")
                key = self._value()
                if key in seen:
                    raise refused(f"the key {key[:40]!r} appears twice")
                seen.add(key)
                self._expect(":", "':'")
                if key in STREAMED:
                    yield from self._records(key)
                else:
                    yield key, self._value()
                if self._expect(",}", "',' or '}'") == "}":
                    break
        if self._peek():
            raise refused(f"data after the export's object at character {self.offset + self.pos}")

    def _records(self, key: str) -> Iterator[tuple[str, Any]]:
        if self._peek() != "[":
            raise refused(f"{key} must be a list")
        self.pos += 1
        if self._peek() == "]":
            self.pos += 1
            return
        while True:
            yield key, self._value()
            if self._expect(",]", f"',' or ']' in {key}") == "]":
                return

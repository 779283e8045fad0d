"""JSON objects sent one after another in one body (REST Proxy v3's streamed records), split as
their bytes arrive: each whole object is handed on as soon as its closing brace is in, so a
stream is answered record by record while it is still being sent.

Only the split happens here (braces counted outside strings); each object's own JSON is parsed
by the caller, so a malformed record is that record's error and the stream goes on. What stands
between objects must be whitespace: anything else breaks the stream (`broken` says why), since
where the next record starts is then unknown; so does an object over the size bound."""

from __future__ import annotations

import re

# A whole string (escapes included), a quote that opens a string not yet whole, or a brace.
_TOKEN = re.compile(rb'"(?:[^"\\]|\\.)*"|"|[{}]', re.DOTALL)
_SPACE = b" \t\r\n"


class ObjectSplitter:
    def __init__(self, max_object_bytes: int) -> None:
        self.max_object_bytes = max_object_bytes
        self._buf = bytearray()
        self._scanned = 0  # bytes of _buf already scanned
        self._depth = 0
        self._start = -1  # where the object being read starts in _buf, -1 between objects
        self.broken: str | None = None  # why the stream cannot be read on; nothing is split after it
        self.count = 0  # objects split so far

    def feed(self, data: bytes) -> list[bytes]:
        """The objects `data` completes, in order, up to where the stream breaks, if it does."""
        if self.broken is not None:
            return []
        self._buf += data
        done: list[bytes] = []
        consumed = 0  # bytes of _buf before the end of the last whole object
        for match in _TOKEN.finditer(self._buf, self._scanned):
            token = match.group()
            if token == b'"':  # a string still arriving: scan it again with the next bytes
                self._scanned = match.start()
                break
            if self._depth == 0:
                if token != b"{" or not self._gap_ok(consumed, match.start()):
                    self.broken = self.broken or f"a record is a JSON object, found {_shown(token)}"
                    return done
                self._start = match.start()
            if token == b"{":
                self._depth += 1
            elif token == b"}":
                self._depth -= 1
                if self._depth == 0:
                    done.append(bytes(self._buf[self._start:match.end()]))
                    self.count += 1
                    consumed, self._start = match.end(), -1
        else:
            self._scanned = len(self._buf)
        if self._start < 0 and not self._gap_ok(consumed, self._scanned):
            return done
        del self._buf[:consumed]
        self._scanned -= consumed
        if self._start >= 0:
            self._start -= consumed
        if len(self._buf) > self.max_object_bytes:
            self.broken = f"a record is over {self.max_object_bytes} bytes (setting max_request_bytes)"
        return done

    def finish(self) -> None:
        """The stream has ended: broken if it ends inside an object, or with anything but
        whitespace after the last one, or held no object at all."""
        if self.broken is None and (self._start >= 0 or self._buf.strip(_SPACE)):
            self.broken = "the stream ends inside a record: its JSON object is not closed"
        elif self.broken is None and self.count == 0:
            self.broken = "the body holds no record: send one JSON object per record"

    def _gap_ok(self, start: int, end: int) -> bool:
        junk = self._buf[start:end].strip(_SPACE)
        if junk:
            self.broken = f"between two records there may be only whitespace, found {_shown(junk)}"
        return not junk


def _shown(data: bytes | bytearray) -> str:
    return repr(bytes(data[:40]).decode(errors="replace"))

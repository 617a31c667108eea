"""Ranks' output in the cell: every line prefixed with its rank.

Bytes arrive from each rank's stdout and stderr pipes in arbitrary pieces;
only whole lines are written, so the lines of two ranks never mix. A line
ended by a carriage return (a progress bar redrawing itself) is passed on
with its '\\r', so the bar still redraws in place.

Used by: course._processes.
"""
from __future__ import annotations

import codecs
import re
import sys

_LINE = re.compile(r"[^\r\n]*(?:\r\n|\n|\r)")


class RankOutput:
    def __init__(self):
        self._pending: dict[tuple[int, str], str] = {}
        self._decoders: dict[tuple[int, str], codecs.IncrementalDecoder] = {}

    def write(self, rank: int, stream: str, data: bytes) -> None:
        key = (rank, stream)
        decoder = self._decoders.setdefault(
            key, codecs.getincrementaldecoder("utf-8")(errors="replace"))
        text = self._pending.pop(key, "") + decoder.decode(data)
        end = 0
        lines = []
        for match in _LINE.finditer(text):
            lines.append(f"[rank {rank}] {match.group(0)}")
            end = match.end()
        if end < len(text):
            self._pending[key] = text[end:]
        if lines:
            self._emit(stream, "".join(lines))

    def flush(self) -> None:
        """Write what is left of unfinished lines, each with a newline."""
        for (rank, stream), text in sorted(self._pending.items()):
            if text:
                self._emit(stream, f"[rank {rank}] {text}\n")
        self._pending.clear()
        self._decoders.clear()

    @staticmethod
    def _emit(stream: str, text: str) -> None:
        target = sys.stdout if stream == "stdout" else sys.stderr
        target.write(text)
        target.flush()

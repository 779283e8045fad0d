"""The code blocks of a Markdown page, each with the marker comment on the line before it.

A guide marks each code block: `<!-- illustrative -->` (shown, not run), or
`<!-- tested: tests/<file>.py -->` (that test runs it). tests/test_docs.py checks that every block
of the guides carries one; tests/test_guides.py runs the blocks marked for it. The page is parsed
as CommonMark (markdown-it-py), so fences inside list items and indented code blocks are found
as the site's renderer finds them."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from markdown_it import MarkdownIt

MARKER = re.compile(r"<!--\s*(illustrative|tested:\s*\S+)\s*-->")


@dataclass(frozen=True)
class Block:
    line: int  # of the opening fence, counted from 1
    language: str  # the fence's info string's first word; "" for an indented code block
    fenced: bool
    text: str
    marker: str | None  # "illustrative", "tested: tests/<file>.py", or None

    @property
    def tested_by(self) -> str | None:
        if self.marker is None or not self.marker.startswith("tested:"):
            return None
        return self.marker.split(":", 1)[1].strip()


def code_blocks(page: Path) -> list[Block]:
    text = page.read_text()
    lines = text.splitlines()
    found = []
    for token in MarkdownIt("commonmark").parse(text):
        if token.type not in ("fence", "code_block") or token.map is None:
            continue
        start = token.map[0]
        marked = MARKER.fullmatch(lines[start - 1].strip()) if start > 0 else None
        marker = re.sub(r":\s*", ": ", marked[1]) if marked else None
        language = token.info.split()[0] if token.info.strip() else ""
        found.append(Block(start + 1, language, token.type == "fence", token.content, marker))
    return found

"""How a benchmark hands its figures to the report (bench/report.py).

Each script prints its markdown section and, given --json PATH, writes:

    {"title": "...",          the section's heading in the report
     "markdown": "...",       the section, as printed (tables, how it was measured)
     "headline": [{"figure": ..., "value": ..., "over": ...}],  rows of the report's first table
     "figures": {...}}        every number, for machines

so that the script owns its tables and the report only assembles them.
"""
from __future__ import annotations

import json
from pathlib import Path


def count(n: int, noun: str, nouns: str | None = None) -> str:
    """'1 run', '3 runs': how many measurements a figure is over."""
    return f"{n} {noun if n == 1 else nouns or noun + 's'}"


def headline_row(figure: str, value: str, over: str) -> dict:
    """One row of the report's first table: what, how much, over how many runs."""
    return {"figure": figure, "value": value, "over": over}


def emit(path: Path | None, *, title: str, markdown: str, headline: list[dict], figures) -> None:
    print(f"## {title}\n\n{markdown}")
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        document = {"title": title, "markdown": markdown, "headline": headline, "figures": figures}
        path.write_text(json.dumps(document, indent=1) + "\n", encoding="utf-8")

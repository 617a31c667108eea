"""The figures README.md, bench/README.md and docs/grading.md cite, each tied to its row of the report's headline.

A page cites a measured figure as a link to the report whose title names the row it comes from:

    [1.14×](results/report.md "data_parallel.py: ring all-reduce (lab 2) / gloo all_reduce, 2 ranks, 16 MB")

(the title is the benchmark script, then the headline row's figure, backticks left out). The link's text is
the row's value, or the value's beginning up to a " (", ", " or "; ": "1.14×" of "1.14× (1.05-1.30)".
`problems` lists every citation whose row the report lacks, or whose text is not the row's value; the tests
hold the pages to report.json with it. `update` rewrites the texts from a new report (`make bench` runs it),
printing what changed, so the pages say what the last run measured.

    python bench/_citations.py [--report bench/results/report.json] [--update]
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", REPO / "bench" / "README.md", REPO / "docs" / "grading.md"]
REPORT_JSON = REPO / "bench" / "results" / "report.json"
CITATION = re.compile(r'\[(?P<text>[^\]]+)\]\((?P<target>(?:\.\./)?(?:bench/)?results/report\.md)(?:#[^\s)]*)?\s+'
                      r'"(?P<script>[\w.]+\.py):\s+(?P<figure>[^"]+)"\)')
CUTS = (" (", ", ", "; ")


@dataclass(frozen=True)
class Citation:
    page: Path
    line: int
    text: str
    script: str
    figure: str
    start: int   # the text's place in the page
    end: int

    def where(self) -> str:
        return f"{self.page.relative_to(REPO) if self.page.is_relative_to(REPO) else self.page}:{self.line}"


def _plain(words: str) -> str:
    return " ".join(words.replace("`", "").split())


def citations(page: Path) -> list[Citation]:
    source = page.read_text(encoding="utf-8")
    return [Citation(page, source.count("\n", 0, m.start()) + 1, _plain(m.group("text")), m.group("script"),
                     _plain(m.group("figure")), m.start("text"), m.end("text"))
            for m in CITATION.finditer(source)]


def headline(report: dict) -> dict[tuple[str, str], str]:
    """{(script, figure without backticks): value} of every row of the report's headline."""
    return {(b["script"], _plain(row["figure"])): _plain(row["value"])
            for b in report["benchmarks"] for row in b.get("headline", [])}


def readings(value: str) -> list[str]:
    """How a page may quote a value: whole, or up to each of its cuts."""
    return [value[:i] for i in sorted(i for cut in CUTS for i in _places(value, cut))] + [value]


def _places(value: str, cut: str) -> list[int]:
    return [m.start() for m in re.finditer(re.escape(cut), value)]


def problems(report: dict, pages: list[Path] = PAGES) -> list[str]:
    rows = headline(report)
    out = []
    for citation in (c for page in pages for c in citations(page)):
        value = rows.get((citation.script, citation.figure))
        if value is None:
            failed = citation.script in report.get("failed", [])
            out.append(f"{citation.where()}: cites {citation.script}'s {citation.figure!r}, which the report "
                       + ("lacks: that benchmark failed in the run" if failed else "has no headline row for"))
        elif citation.text not in readings(value):
            out.append(f"{citation.where()}: says {citation.text!r} where the report has {value!r} for "
                       f"{citation.script}'s {citation.figure!r}")
    return out


def update(report: dict, pages: list[Path] = PAGES, say=print) -> int:
    """Rewrite every citation's text from `report`, cut where it was cut; how many changed."""
    rows, changed = headline(report), 0
    for page in pages:
        source, edits = page.read_text(encoding="utf-8"), []
        for citation in citations(page):
            value = rows.get((citation.script, citation.figure))
            if value is None:
                continue
            cuts = sum(citation.text.count(cut) for cut in CUTS)
            new = next((r for r in readings(value) if sum(r.count(cut) for cut in CUTS) == cuts), value)
            if new != citation.text:
                edits.append((citation, new))
                say(f"{citation.where()}: {citation.text} -> {new}")
        for citation, new in reversed(edits):
            source = source[:citation.start] + new + source[citation.end:]
        if edits:
            page.write_text(source, encoding="utf-8")
        changed += len(edits)
    return changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--report", type=Path, default=REPORT_JSON, help="the report's JSON")
    parser.add_argument("--update", action="store_true", help="rewrite the pages' cited figures from the report")
    args = parser.parse_args(argv)
    report = json.loads(args.report.read_text(encoding="utf-8"))
    if args.update:
        print(f"{update(report)} cited figures rewritten from {args.report}")
    found = problems(report)
    for problem in found:
        print(problem, file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())

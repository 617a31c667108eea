"""Covers: bench._citations.

Every figure README.md, bench/README.md and docs/grading.md cite from the 2-core CPU machine is a row of the last
`make bench` report's headline (bench/results/report.json), quoted as the report has it: a figure the
report lacks, or a page that quotes another value, fails here. README.md's and bench/README.md's
measured-looking numbers outside a citation are held too, so that a figure cannot be cited around it."""
from __future__ import annotations

import json
import re

import _citations  # bench/_citations.py (the conftest puts bench/ on sys.path)
import pytest

from helpers import REPO

REPORT = json.loads((REPO / "bench" / "results" / "report.json").read_text(encoding="utf-8"))

FAKE_REPORT = {"failed": ["broken.py"], "benchmarks": [
    {"script": "ring.py", "headline": [{"figure": "ring / gloo `all_reduce`, 2 ranks", "value": "1.14× (1.05-1.30)",
                                        "over": "15 rounds"},
                                       {"figure": "a lab headless", "value": "11.4 s, peak 0.78 GB", "over": "1 run"}]},
    {"script": "broken.py", "headline": []}]}


def page(tmp_path, text: str):
    path = tmp_path / "README.md"
    path.write_text(text, encoding="utf-8")
    return path


def test_every_figure_the_pages_cite_is_in_the_report_as_they_quote_it():
    assert _citations.problems(REPORT) == []


def test_the_pages_cite_every_benchmark_that_ran_and_the_report_ran_them_all():
    cited = {c.script for p in _citations.PAGES for c in _citations.citations(p)}
    ran = {b["script"] for b in REPORT["benchmarks"]}
    assert REPORT["failed"] == []
    assert ran - cited == set(), f"no page cites {sorted(ran - cited)}"
    assert any(c.page.name == "README.md" and c.page.parent == REPO for c in _citations.citations(REPO / "README.md"))


def test_a_cited_figure_missing_from_the_report_fails_naming_page_line_and_row(tmp_path):
    readme = page(tmp_path, 'Ring: [1.14×](results/report.md "ring.py: ring / gloo all_reduce, 2 ranks").\n'
                            'Lost: [2.0×](results/report.md "ring.py: ring / gloo all_reduce, 8 ranks").\n'
                            'Broken: [3 s](results/report.md "broken.py: its time").\n')
    found = _citations.problems(FAKE_REPORT, [readme])
    assert len(found) == 2, found
    assert ":2: cites ring.py's 'ring / gloo all_reduce, 8 ranks', which the report has no headline row for" in found[0]
    assert ":3: cites broken.py's 'its time'" in found[1] and "that benchmark failed" in found[1]


def test_a_quoted_value_is_the_report_s_whole_or_cut_at_a_bracket_or_comma(tmp_path):
    good = page(tmp_path, '[1.14×](results/report.md "ring.py: ring / gloo all_reduce, 2 ranks") and '
                          '[1.14× (1.05-1.30)](results/report.md "ring.py: ring / gloo all_reduce, 2 ranks") and\n'
                          '[11.4 s](bench/results/report.md#labs "ring.py: a lab headless")')
    assert _citations.problems(FAKE_REPORT, [good]) == []
    for wrong in ("1.1×", "1.14× (1.05", "11.4"):
        bad = page(tmp_path, f'[{wrong}](results/report.md "ring.py: ring / gloo all_reduce, 2 ranks")')
        (problem,) = _citations.problems(FAKE_REPORT, [bad])
        assert f"says {wrong!r} where the report has '1.14× (1.05-1.30)'" in problem


def test_update_rewrites_each_quote_from_the_report_cut_where_it_was(tmp_path):
    readme = page(tmp_path, 'Ring [1.33×](results/report.md "ring.py: ring / gloo\n all_reduce, 2 ranks"), '
                            'whole [1.33× (1.2-1.5)](results/report.md "ring.py: ring / gloo all_reduce, 2 ranks"); '
                            'a lab [12.0 s](results/report.md "ring.py: a lab headless"), '
                            'gone [9 s](results/report.md "ring.py: no such row").\n')
    said = []
    assert _citations.update(FAKE_REPORT, [readme], say=said.append) == 3
    text = readme.read_text(encoding="utf-8")
    assert "Ring [1.14×](" in text and "whole [1.14× (1.05-1.30)](" in text and "a lab [11.4 s](" in text
    assert "gone [9 s](" in text   # no row: left for problems() to name
    assert said[0].endswith("1.33× -> 1.14×") and len(said) == 3
    assert [p for p in _citations.problems(FAKE_REPORT, [readme]) if "no such row" not in p] == []


# A measured-looking figure: a decimal with a unit. Goals and promises say so; the other machines' runs and the
# hand-measured figures have sections of their own.
MEASURED = re.compile(r"\b\d+\.\d+ ?(?:×|ms\b|s\b|GB/s|GB\b|MB/s|%)")
STATED_NOT_MEASURED = ("goal", "promise", "≤", "at most", "within", "limit")
OTHER_SOURCES = ("H100", "H200", "Figures no script writes")   # a heading with one of these, and its subsections


def uncited_figures(path) -> list[str]:
    out, headings = [], {}
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        level = len(line) - len(line.lstrip("#"))
        if line.startswith("#") and line[level:level + 1] == " ":
            headings = {k: v for k, v in headings.items() if k < level} | {level: line}
            continue
        if any(source in heading for heading in headings.values() for source in OTHER_SOURCES):
            continue
        bare = _citations.CITATION.sub("", line)
        for m in MEASURED.finditer(bare):
            before = bare[max(0, m.start() - 40):m.start()]
            if not any(word in before for word in STATED_NOT_MEASURED):
                out.append(f"{path.name}:{number}: {m.group(0)!r} in {line.strip()[:100]!r}")
    return out


@pytest.mark.parametrize("path", [REPO / "README.md", REPO / "bench" / "README.md"],
                         ids=lambda p: str(p.relative_to(REPO)))
def test_a_measured_figure_on_the_pages_is_a_citation(path):
    assert uncited_figures(path) == []


def test_the_rule_for_uncited_figures_catches_one(tmp_path):
    readme = page(tmp_path, "## Lab 2\n\nThe ring took 1.14× gloo's time (goal 1.3×).\n\n"
                            "## Figures no script writes\n\n### Anything\n\nIt took 3.5 s.\n")
    assert uncited_figures(readme) == ["README.md:3: '1.14×' in \"The ring took 1.14× gloo's time (goal 1.3×).\""]

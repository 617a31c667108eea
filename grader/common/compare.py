"""Comparing two release trees: notebooks as parsed JSON, other files byte
for byte (used by ``python -m grader release --check`` and the tests)."""

from __future__ import annotations

import fnmatch
import json
from pathlib import Path

# --------------------------------------------------------------------------
# Comparing releases (used by --check and tests/test_release.py)
# --------------------------------------------------------------------------


def _ignored(rel: Path, patterns: list[str]) -> bool:
    return any(fnmatch.fnmatch(part, p) for part in rel.parts for p in patterns)


def _files(top: Path, patterns: list[str]) -> set[Path]:
    if not top.is_dir():
        return set()
    return {
        p.relative_to(top)
        for p in top.rglob("*")
        if p.is_file() and not _ignored(p.relative_to(top), patterns)
    }


def _first_difference(a, b, where: str = "") -> str:
    """JSON path of the first place where a and b differ, e.g. cells[3].source."""
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            if a.get(k, KeyError) != b.get(k, KeyError):
                return _first_difference(a.get(k), b.get(k), f"{where}.{k}" if where else k)
    elif isinstance(a, list) and isinstance(b, list):
        for i, (x, y) in enumerate(zip(a, b)):
            if x != y:
                return _first_difference(x, y, f"{where}[{i}]")
        if len(a) != len(b):
            return f"{where} (length {len(a)} vs {len(b)})"
    return where or "(top level)"


def compare_releases(expected: Path, actual: Path, patterns: list[str] = ()) -> list[str]:
    """Differences between two release trees, one line each (empty: equal).

    "missing": only in ``expected``; "extra": only in ``actual``.
    Notebooks are compared as parsed JSON (formatting does not matter), other
    files byte for byte. Paths matching ``patterns`` (e.g. .ipynb_checkpoints)
    are skipped: they are local litter, never part of a release.
    """
    patterns = list(patterns)
    exp, act = _files(Path(expected), patterns), _files(Path(actual), patterns)
    problems = [f"missing: {p}" for p in sorted(exp - act)]
    problems += [f"extra: {p}" for p in sorted(act - exp)]
    for rel in sorted(exp & act):
        a, b = Path(expected) / rel, Path(actual) / rel
        if rel.suffix == ".ipynb":
            try:
                ja, jb = json.loads(a.read_text(encoding="utf-8")), json.loads(b.read_text(encoding="utf-8"))
            except (ValueError, UnicodeDecodeError) as e:
                problems.append(f"differs: {rel} (unreadable: {e})")
                continue
            if ja != jb:
                problems.append(f"differs: {rel} (first at {_first_difference(ja, jb)})")
        elif a.read_bytes() != b.read_bytes():
            problems.append(f"differs: {rel}")
    return problems

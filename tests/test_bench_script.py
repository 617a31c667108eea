"""Covers: bench._script.

bench/_script.py: the command line that bench/experts.py, long_sequences.py and pipeline.py share
(--rounds, --quick, --json), decided once: the sizes, the rounds, and a round count below 1 refused."""
from __future__ import annotations

from pathlib import Path

import _script  # bench/_script.py (the conftest puts bench/ on sys.path)
import pytest

FULL, QUICK = {"rows": 4096}, {"rows": 64}


def parse(*argv):
    return _script.options("A benchmark.\n\nMore.", list(argv), full=FULL, quick=QUICK, default_rounds=5,
                           rounds_help="rounds of the timing", quick_help="small sizes: for tests")


def test_the_full_size_by_default_and_the_quick_one_on_asking():
    assert parse() == _script.Options(quick=False, rounds=5, sizes=FULL, json=None)
    assert parse("--quick", "--json", "out.json") == _script.Options(quick=True, rounds=1, sizes=QUICK,
                                                                     json=Path("out.json"))
    assert parse("--quick", "--rounds", "3").rounds == 3


@pytest.mark.parametrize("rounds", ["0", "-2"])
def test_no_rounds_is_refused_with_the_reason(rounds, capsys):
    with pytest.raises(SystemExit) as stopped:
        parse("--rounds", rounds)
    assert stopped.value.code == 2 and f"--rounds {rounds}: at least 1 round" in capsys.readouterr().err

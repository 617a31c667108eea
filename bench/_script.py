"""The command line the lab benchmarks with a quick size share (experts, long_sequences, pipeline):
--rounds, --quick and --json, and what they decide: the sizes, how many rounds, where the figures go.

    options = _script.options(__doc__, argv, full=FULL, quick=QUICK, default_rounds=5,
                              rounds_help="rounds of each timing", quick_help="small sizes, 1 round: for tests")
    ... options.sizes, options.rounds ...
    emit(options.json, title=..., markdown=..., headline=..., figures=figures)

--quick is the size the tests run: small sizes and 1 round, unless --rounds says otherwise.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Options:
    quick: bool
    rounds: int
    sizes: dict
    json: Path | None


def options(doc: str, argv: list[str] | None, *, full: dict, quick: dict, default_rounds: int,
            rounds_help: str, quick_help: str) -> Options:
    """The script's options from argv (sys.argv where None); --rounds below 1 is refused, as argparse refuses."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--rounds", type=int, help=f"{rounds_help} (default {default_rounds}; 1 quick)")
    parser.add_argument("--quick", action="store_true", help=quick_help)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    rounds = args.rounds if args.rounds is not None else (1 if args.quick else default_rounds)
    if rounds < 1:
        parser.error(f"--rounds {rounds}: at least 1 round")
    return Options(quick=args.quick, rounds=rounds, sizes=quick if args.quick else full, json=args.json)

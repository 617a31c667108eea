"""Bytes each rank sends per collective: the formula against gloo's sockets.

Runs every collective once on a ROWS x COLS float32 tensor (default 1000 x 500,
2,000,000 bytes) on 2 and 4 ranks and gives, per operation and rank, the bytes
predicted by the algorithm's formula and the bytes the process wrote (the
wchar line of /proc/self/io), with the difference (gloo's headers). Byte
counts do not vary from run to run: one run.

    python bench/comm_bytes.py [--rows 1000] [--cols 500] [--json PATH]
"""
import argparse
from pathlib import Path

from _results import emit, headline_row

import course
from course import comm

RANKS = (2, 4)


def records(world_size: int, rows: int, cols: int) -> tuple[str, list[dict]]:
    """(backend, one dict per operation and rank)."""
    results = course.launch(comm.every_collective, world_size, args=(rows, cols))
    return results.backend, [{"op": r.op, "rank": r.rank, "algorithm": r.algorithm, "predicted": r.predicted,
                              "measured": r.measured, "shared": r.shared}
                             for r in sorted(results.comm, key=lambda r: (r.op, r.rank))]


def markdown(by_ranks: list[dict], rows: int, cols: int) -> str:
    lines = [f"Every collective once on a {rows}×{cols} float32 tensor ({rows * cols * 4:,} bytes), "
             "one run; measured: bytes the rank wrote to its sockets (`/proc/self/io`), on gloo under Linux."]
    for run in by_ranks:
        lines += ["", f"{run['ranks']} ranks, {run['backend']}:", "",
                  "| operation | rank | predicted | measured | headers | algorithm |", "|---|---|---|---|---|---|"]
        for r in run["records"]:
            measured, extra = ("n/a", "") if r["measured"] is None else (f"{r['measured']:,}",
                                                                         f"{r['measured'] - r['predicted']:,.0f}")
            lines.append(f"| {r['op']} | {r['rank']} | {r['predicted']:,.0f} | {measured} | {extra} "
                         f"| {r['algorithm']} |")
    return "\n".join(lines)


def headline(by_ranks: list[dict]) -> list[dict]:
    rows = []
    for run in by_ranks:
        measured = [r for r in run["records"] if r["measured"] is not None]
        if not measured:
            rows.append(headline_row(f"bytes per collective, {run['ranks']} ranks",
                                     "not measured here (needs gloo on Linux)", "1 run"))
            continue
        extra = [r["measured"] - r["predicted"] for r in measured]
        share = max((r["measured"] - r["predicted"]) / r["predicted"] for r in measured if r["predicted"])
        rows.append(headline_row(f"bytes on sockets − formula, each of {len(measured)} collectives × ranks, "
                                 f"{run['ranks']} ranks", f"{min(extra):+,.0f} to {max(extra):+,.0f} B "
                                 f"(at most {share:.3%} of the formula)", "1 run"))
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1000)
    parser.add_argument("--cols", type=int, default=500)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    options = parser.parse_args()
    by_ranks = []
    for world_size in RANKS:
        backend, found = records(world_size, options.rows, options.cols)
        by_ranks.append({"ranks": world_size, "backend": backend, "records": found})
    emit(options.json, title="Bytes per collective: measured against predicted",
         markdown=markdown(by_ranks, options.rows, options.cols), headline=headline(by_ranks),
         figures={"rows": options.rows, "cols": options.cols, "by_ranks": by_ranks})


if __name__ == "__main__":
    main()

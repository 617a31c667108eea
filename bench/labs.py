"""Each lab's headless execution time and peak memory, all ranks together.

Every solution notebook `solutions/<lab>/<lab>.ipynb` (and the live demo,
`solutions/demo.ipynb`, as an extra row) is executed top to bottom the way
tests/test_notebooks.py does it (`grader.common.execute`: this interpreter's kernel,
figures inline), in a temporary folder, at its default sizes. The labs whose
ranks come from `course.lab_ranks` run again with $COURSE_RANKS set to each
--ranks count (unless that is already their default).

Memory: the peak of the summed PSS of the kernel and all its descendants (the
forkserver and every rank), beside the summed RSS sampled every 50 ms;
bench/_peak_memory.py says why PSS, and how often it is read. The course
promises under 4 GB per lab with 4 CPU ranks. GPU memory, where NVIDIA's library answers: every
GPU's memory in use, summed, its peak above what was in use at the start (a column of its own).
Works as it is on a GPU machine, whose name the figures record.

Time: the course promises each lab within 90 s at its default ranks on 2 CPU
cores, within 3 minutes on 4 ranks, and no cell of the live demo over 30 s.
The tests run every notebook too, but beside other tests and never asserting on
wall-clock speed; this script, run alone, is what holds the promise.

    python bench/labs.py [--labs 00_ranks demo ...] [--ranks 4] [--rounds 1] [--json PATH]
"""
from __future__ import annotations

import argparse
import datetime
import re
import sys
import tempfile
from pathlib import Path

import nbformat
from _machine import describe
from _peak_memory import PeakMemory
from _results import count, emit, headline_row
from _rounds import spread, spread_text
from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError

from course.placement import RANKS_VARIABLE
from grader.common.execute import execute

REPO = Path(__file__).resolve().parents[1]
SOLUTIONS = REPO / "solutions"
DEMO = "demo"  # solutions/demo.ipynb
CELL_TIMEOUT_S = 300  # as in tests/test_notebooks.py
LIMIT_BYTES = 4e9  # the course's promise: a lab on 4 CPU ranks stays under 4 GB
TIME_BUDGET_S = 90  # ... a lab at its default ranks runs within 90 s on 2 CPU cores
FOUR_RANKS_TIME_BUDGET_S = 180  # ... and within 3 minutes on 4 ranks
DEMO_CELL_BUDGET_S = 30  # ... and no cell of the live demo takes longer than this
_LAB_RANKS = re.compile(r"course\.lab_ranks\((\d*)\)")
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def notebook_path(lab: str) -> Path:
    return SOLUTIONS / f"{DEMO}.ipynb" if lab == DEMO else SOLUTIONS / lab / f"{lab}.ipynb"


def all_labs() -> list[str]:
    return sorted(p.parent.name for p in SOLUTIONS.glob("*/*.ipynb") if p.stem == p.parent.name)


def default_ranks(path: Path) -> int | None:
    """The lab's ranks when $COURSE_RANKS is unset; None when it does not read $COURSE_RANKS."""
    found = _LAB_RANKS.search(path.read_text(encoding="utf-8"))
    if found is None:
        return None
    return int(found.group(1) or 2)  # course.lab_ranks()'s own default


def configurations(labs: list[str], extra_ranks: list[int]) -> list[dict]:
    """One run per lab at its default, one more per --ranks count for labs that read $COURSE_RANKS."""
    runs = []
    for lab in labs:
        default = default_ranks(notebook_path(lab))
        runs.append({"lab": lab, "ranks": default, "env": {}})
        for n in extra_ranks:
            if default is not None and n != default:
                runs.append({"lab": lab, "ranks": n, "env": {RANKS_VARIABLE: str(n)}})
    return runs


def cell_seconds(cell) -> float:
    """How long an executed code cell ran, from the timing nbclient records in its metadata."""
    timing = cell.metadata["execution"]
    start, end = (datetime.datetime.fromisoformat(timing[key].replace("Z", "+00:00"))
                  for key in ("iopub.execute_input", "shell.execute_reply"))
    return (end - start).total_seconds()


def _whole_run_budget_s(run: dict) -> int:
    return FOUR_RANKS_TIME_BUDGET_S if run["ranks"] == 4 else TIME_BUDGET_S


def time_budget(run: dict) -> str:
    """The promise a run is held to, in words."""
    return f"{_whole_run_budget_s(run)} s" + (f", cells {DEMO_CELL_BUDGET_S} s" if run["lab"] == DEMO else "")


def in_time(run: dict, seconds: float, slowest_cell_s: float) -> bool:
    """Whether a run kept its promise (time_budget): the whole run, and for the demo each cell."""
    return seconds <= _whole_run_budget_s(run) and (run["lab"] != DEMO or slowest_cell_s <= DEMO_CELL_BUDGET_S)


def run_once(notebook: Path, env: dict[str, str]) -> dict:
    """Execute the notebook once: {"seconds", "slowest_cell_s", memory figures (bench/_peak_memory.py)}
    or {"error"}."""
    nb = nbformat.read(notebook, as_version=4)
    progress = {}

    def on_cell_start(cell, cell_index, **_):
        progress["cell"] = cell_index

    with tempfile.TemporaryDirectory(prefix=f"bench-{notebook.stem}-") as folder, PeakMemory() as memory:
        try:
            seconds = execute(nb, Path(folder), timeout=CELL_TIMEOUT_S, env=env, on_cell_start=on_cell_start)
        except (CellExecutionError, CellTimeoutError, DeadKernelError) as e:
            last_line = _ANSI.sub("", str(e)).strip().splitlines()[-1:] or [type(e).__name__]
            return {"error": f"cell {progress.get('cell', '?')}: {type(e).__name__}: {last_line[0][:300]}"}
    slowest = max((cell_seconds(c) for c in nb.cells if c.cell_type == "code"), default=0.0)
    return {"seconds": seconds, "slowest_cell_s": slowest, **memory.figures()}


def measure(runs: list[dict], rounds: int) -> list[dict]:
    """Each configuration `rounds` times, round by round; a configuration that fails once is failed."""
    outcomes = {i: [] for i in range(len(runs))}
    for _ in range(rounds):
        for i, run in enumerate(runs):
            if not any("error" in o for o in outcomes[i]):
                outcomes[i].append(run_once(notebook_path(run["lab"]), run["env"]))
                print(f"{run['lab']} on {run['ranks'] or 'its own'} ranks: {outcomes[i][-1]}", file=sys.stderr)
    rows = []
    for i, run in enumerate(runs):
        row = {"lab": run["lab"], "ranks": run["ranks"], "env": run["env"]}
        failed = [o["error"] for o in outcomes[i] if "error" in o]
        if failed:
            rows.append({**row, "error": failed[0]})
            continue
        peak = max(outcomes[i], key=lambda o: o["peak_bytes"])
        seconds, slowest = (spread([o[key] for o in outcomes[i]]) for key in ("seconds", "slowest_cell_s"))
        rows.append({**row, "seconds": seconds, "slowest_cell_s": slowest,
                     "in_time": in_time(run, seconds["median"], slowest["median"]),
                     "peak": peak, "within_limit": peak["peak_bytes"] < LIMIT_BYTES})
    return rows


def gigabytes(n: float) -> str:
    return f"{n / 1e9:.2f} GB"


def markdown(rows: list[dict], rounds: int, machine: dict) -> str:
    metric = next((r["peak"]["metric"].upper() for r in rows if "peak" in r), "PSS")
    on_gpu = any(r.get("peak", {}).get("peak_gpu_bytes") is not None for r in rows)
    gpu_words = ("GPU memory: every GPU's memory in use, summed, its peak above the start (CUDA contexts "
                 "included; other processes on the GPUs would count too)." if on_gpu else "GPU memory is not counted.")
    how_often = count(rounds, "run") + (" each; time: median (min-max)" if rounds > 1 else " each")
    lines = [f"Each solution notebook executed headless at its default sizes, in a temporary folder "
             f"({how_often}). Memory: the peak of the summed {metric} of the kernel and all its descendants "
             f"(forkserver, ranks); the summed RSS beside it counts the pages that forked ranks share once "
             f"per rank, an upper bound. RSS is read every 50 ms; {metric} costs more, and is read as often as "
             f"keeps that near a tenth of a core (`every`: the mean interval) and whenever RSS grows past its "
             f"earlier peaks (bench/_peak_memory.py says why). Limit: {gigabytes(LIMIT_BYTES)}, the course's "
             f"promise for a lab on 4 CPU ranks. {gpu_words} Time: within {TIME_BUDGET_S} s at "
             f"the default ranks, {FOUR_RANKS_TIME_BUDGET_S} s on 4, no cell of the demo over "
             f"{DEMO_CELL_BUDGET_S} s (the course's promise on 2 CPU cores).", "",
             f"| notebook | ranks | run | peak memory ({metric}) | under {gigabytes(LIMIT_BYTES)} | every | "
             f"peak summed RSS | processes | slowest cell | within its time |" + " peak GPU memory |" * on_gpu,
             "|---|---|---|---|---|---|---|---|---|---|" + "---|" * on_gpu]
    for r in rows:
        ranks = r["ranks"] or "its own"
        if "error" in r:
            lines.append(f"| `{r['lab']}` | {ranks} | FAILED: {r['error']} | | | | | | | |" + " |" * on_gpu)
            continue
        p = r["peak"]
        lines.append(f"| `{r['lab']}` | {ranks} | {spread_text(r['seconds'], '{:.1f}', ' s')} | "
                     f"{gigabytes(p['peak_bytes'])} | {'yes' if r['within_limit'] else '**no**'} | "
                     f"{p['pss_interval_s'] * 1e3:.0f} ms | {gigabytes(p['peak_rss_bytes'])} | "
                     f"{p['most_processes']} | {spread_text(r['slowest_cell_s'], '{:.1f}', ' s')} | "
                     f"{'yes' if r['in_time'] else '**no**'} ({time_budget(r)}) |"
                     + (f" {gigabytes(p['peak_gpu_bytes'] or 0)} |" if on_gpu else ""))
    lines += ["", f"(`its own`: the notebook picks its ranks itself, not from ${RANKS_VARIABLE}; "
              f"torch {machine['torch']}, {machine['cpu_count']} CPUs, "
              f"{', '.join(machine['gpus']) or 'no GPU'})"]
    return "\n".join(lines)


def headline(rows: list[dict], rounds: int) -> list[dict]:
    over = count(rounds, "run")
    out = [headline_row(f"`{r['lab']}` headless" + (f", {r['ranks']} ranks" if r["ranks"] else ""),
                        f"FAILED: {r['error']}" if "error" in r else
                        f"{spread_text(r['seconds'], '{:.1f}', ' s')}, peak {gigabytes(r['peak']['peak_bytes'])}",
                        over) for r in rows]
    timed = [r for r in rows if "error" not in r]
    if timed:
        late = [f"`{r['lab']}`" + (f" on {r['ranks']} ranks" if r["ranks"] else "") for r in timed if not r["in_time"]]
        out.append(headline_row("every notebook within its time",
                                f"**no**: {', '.join(late)}" if late else
                                "yes" + (f" for {len(timed)} of {len(rows)}; the others failed"
                                         if len(timed) < len(rows) else ""), over))
    # The promise is on 4 ranks; a run without the reruns (--ranks with no count) holds every run to it instead.
    reran = any(r["env"] for r in rows)
    on_four = [r for r in rows if r["ranks"] == 4] if reran else rows
    measured = [r for r in on_four if "error" not in r]
    if on_four:
        verdict = "yes" if all(r["within_limit"] for r in measured) else "**no**"
        if not measured:
            verdict = f"not known: every run {'on 4 ranks ' if reran else ''}failed"
        elif len(measured) < len(on_four):  # a failed run says nothing about its memory
            verdict = f"{verdict} for {len(measured)} of {len(on_four)}; the others failed"
        if measured:
            worst = max(measured, key=lambda r: r["peak"]["peak_bytes"])
            verdict += f" (most: `{worst['lab']}`, {gigabytes(worst['peak']['peak_bytes'])})"
        out.append(headline_row(f"every lab {'on 4 ranks' if reran else 'at its default ranks'} under "
                                f"{gigabytes(LIMIT_BYTES)}", verdict, over))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--labs", nargs="+", metavar="LAB",
                        help=f"lab folders under solutions/, or {DEMO!r} (default: every lab, then the demo)")
    parser.add_argument("--ranks", nargs="*", type=int, default=[4], metavar="N",
                        help="also run the labs that read $COURSE_RANKS on N ranks (default: 4)")
    parser.add_argument("--rounds", type=int, default=1, help="runs of each notebook (default: 1)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    labs = args.labs or [*all_labs(), DEMO]
    missing = [lab for lab in labs if not notebook_path(lab).is_file()]
    if missing:
        parser.error(f"no notebook for {', '.join(missing)}: expected solutions/<lab>/<lab>.ipynb; "
                     f"the labs are {', '.join(all_labs())} and {DEMO!r}")
    if args.rounds < 1 or any(n < 1 for n in args.ranks):
        parser.error("--rounds and --ranks must be positive whole numbers")
    rows = measure(configurations(labs, args.ranks), args.rounds)
    machine = describe()  # last: on a GPU machine it starts CUDA in this process
    emit(args.json, title="Labs executed headless: time and peak memory",
         markdown=markdown(rows, args.rounds, machine), headline=headline(rows, args.rounds),
         figures={"rounds": args.rounds, "limit_bytes": LIMIT_BYTES, "machine": machine, "runs": rows})
    return 1 if any("error" in r for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())

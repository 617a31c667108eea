"""`make bench`: every benchmark under bench/, one report.

Runs each benchmark script in its own process (a crash, a hang or a leaked rank
stays with it) with --json, at the rounds chosen below to fit the whole run in
15 minutes on a 2-core machine, then writes report.md and report.json into
--out (default bench/results/): the machine, one headline table (every figure
README.md, bench/README.md and docs/grading.md cite: bench/_citations.py), each benchmark's own
section with its command, when it ran, on what and how long it took.
bench/_results.py says what a script hands over; one that writes only its
figures gets its printed output as its section. A benchmark that fails (exits
non-zero, writes no JSON, or runs out of time) is reported as failed, with the
end of its output, and makes this script exit 1.

--quick runs each at its smallest (a few minutes: to see that they all run, not
figures) into build/bench-quick/ unless --out says otherwise.

    python bench/report.py [SCRIPT ...] [--quick] [--out bench/results] [--timeout 600]

With no SCRIPT: every bench/*.py but the helpers (bench/_*.py), this one and
those for other machines than the course's (HARDWARE_ONLY).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _machine import describe, load_average, load_text, text

BENCH = Path(__file__).resolve().parent
QUICK_OUT = BENCH.parent / "build" / "bench-quick"
# `make check-hardware` runs these on another machine; on the course's, the tests hold what they check
# (tests/test_notebooks.py runs every solution against its stored values).
HARDWARE_ONLY = {"stored_values.py"}
# Rounds for the report, chosen to fit 15 minutes on 2 cores; the scripts' own defaults are larger.
ARGUMENTS = {
    "launch_latency.py": ["--repeats", "10", "--spawn-repeats", "2"],
    "gloo_link.py": ["--runs", "3"],
    "data_parallel.py": ["--rounds", "10"],
    "model_parallel.py": ["--rounds", "5"],
    "sharded.py": ["--rounds", "10"],
    "pipeline.py": ["--rounds", "3"],
    "long_sequences.py": ["--rounds", "3"],
    "experts.py": ["--rounds", "2"],
    "expert_overlap.py": ["--rounds", "7"],
    "composition.py": ["--rounds", "3"],
    "labs.py": ["--ranks"],                 # each lab at its default ranks only: --ranks 4 adds 4 minutes
    "grading.py": ["--rounds", "1"],
    # the class's bill: the hanging submission's cells stopped at 15 s, not 300, and projected (bench/grading_cost.py
    # says how); its scaling and flood are the whole run's (python bench/grading_cost.py, 11 minutes more)
    "grading_cost.py": ["--for-report"],
}
# --quick: each script at its smallest.
QUICK_ARGUMENTS = {
    "launch_latency.py": ["--repeats", "2", "--spawn-repeats", "1"],
    "gloo_link.py": ["--runs", "1"],
    "data_parallel.py": ["--rounds", "1"],
    "model_parallel.py": ["--rounds", "1"],
    "sharded.py": ["--rounds", "1"],
    "pipeline.py": ["--quick"],
    "long_sequences.py": ["--quick"],
    "experts.py": ["--quick"],
    "expert_overlap.py": ["--quick"],
    "composition.py": ["--quick"],
    "labs.py": ["--labs", "00_ranks", "demo"],
    "grading.py": ["--lab", "01_single_gpu"],
    "grading_cost.py": ["--quick", "--lab", "01_single_gpu"],
    "single_gpu.py": ["--steps", "2"],
}
# Run in this order (others after, by name): grading.py reuses labs.py's runs of the same notebooks and
# grading_cost.py's grades.
ORDER = ["launch_latency.py", "comm_bytes.py", "gloo_link.py", "data_parallel.py", "model_parallel.py",
         "sharded.py", "pipeline.py", "long_sequences.py", "experts.py", "expert_overlap.py", "labs.py",
         "grading_cost.py", "grading.py"]
TAIL_LINES = 15


def benchmarks() -> list[Path]:
    return [p for p in sorted(BENCH.glob("*.py")) if not p.name.startswith("_") and p.name != Path(__file__).name
            and p.name not in HARDWARE_ONLY]


def in_order(scripts: list[Path]) -> list[Path]:
    rank = {name: i for i, name in enumerate(ORDER)}
    return sorted(scripts, key=lambda p: (rank.get(p.name, len(ORDER)), p.name))


def arguments(script: Path, json_of: dict[str, Path], quick: bool = False) -> list[str]:
    extra = list((QUICK_ARGUMENTS if quick else ARGUMENTS).get(script.name, []))
    if script.name == "grading.py":
        for option, source in (("--runs-from", "labs.py"), ("--grades-from", "grading_cost.py")):
            if json_of.get(source) is not None and json_of[source].is_file():
                extra += [option, str(json_of[source])]
    return extra


def read_document(path: Path, stdout: str, script: Path) -> tuple[dict | None, str | None]:
    """(what a script wrote with --json, in bench/_results.py's form, or None; why not, or None).

    A script that writes only its figures gets its printed output as its section, and no headline rows.
    """
    if not path.is_file():
        return None, "wrote no --json file: every bench script must write one (see bench/_results.py)"
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        return None, f"wrote a --json file that is not JSON ({e})"
    if isinstance(document, dict) and {"title", "markdown", "headline", "figures"} <= document.keys():
        return document, None
    return {"title": f"bench/{script.name}", "markdown": stdout.strip(), "headline": [], "figures": document}, None


def run_one(script: Path, json_path: Path, extra: list[str], logs: Path, timeout_s: float) -> dict:
    """Run a benchmark: {"script", "command", "seconds", "status", "document" (or None), "error", "output"}."""
    command = [sys.executable, str(script), "--json", str(json_path), *extra]
    stdout_log, stderr_log = logs.with_suffix(".out"), logs.with_suffix(".err")
    began, load_before = datetime.datetime.now(datetime.UTC), load_average()
    started = time.perf_counter()
    with stdout_log.open("w", encoding="utf-8") as stdout, stderr_log.open("w", encoding="utf-8") as stderr:
        # A session of its own, so that a timeout ends it with every kernel and rank it started.
        process = subprocess.Popen(command, cwd=BENCH.parent, stdout=stdout, stderr=stderr, start_new_session=True)
        try:
            code = process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            code = None
    seconds = time.perf_counter() - started
    printed = stdout_log.read_text(encoding="utf-8", errors="replace")
    document, unusable = read_document(json_path, printed, script)
    if code is None:
        error = f"was still running after {timeout_s:.0f} s and was stopped"
    elif code != 0:
        error = f"exited with code {code}"
    else:
        error = unusable
    output = (stderr_log.read_text(encoding="utf-8", errors="replace").strip() or printed).splitlines()
    shown = " ".join(["python", f"bench/{script.name}", *extra]).replace(f"{json_path.parent}{os.sep}", "")
    return {"script": script.name, "command": shown, "started": began.isoformat(timespec="seconds"),
            "load": [load_before, load_average()], "seconds": seconds,
            "status": "failed" if error else "ok", "document": document, "error": error,
            "output": "\n".join(output[-TAIL_LINES:])}


def run_all(scripts: list[Path], workdir: Path, timeout_s: float, quick: bool = False) -> list[dict]:
    results, json_of = [], {}
    for script in in_order(scripts):
        json_of[script.name] = workdir / f"{script.stem}.json"
        print(f"== {script.name} ...", end=" ", flush=True)
        result = run_one(script, json_of[script.name], arguments(script, json_of, quick),
                         workdir / script.stem, timeout_s)
        print(f"{result['status']} in {result['seconds']:.0f} s", flush=True)
        results.append(result)
    return results


def markdown(results: list[dict], machine: dict, seconds: float, quick: bool = False) -> str:
    failed = [r for r in results if r["status"] != "ok"]
    lines = ["# Benchmark report" + (" (--quick: the smallest sizes, not figures)" if quick else ""), "",
             f"Machine: {text(machine)}.", "",
             f"`make bench` ran {len(results)} benchmarks in {seconds / 60:.1f} minutes"
             + (f"; **{len(failed)} failed**: {', '.join(r['script'] for r in failed)}." if failed else ".")
             + " Timings are medians of repeated runs with their range (min-max); ratios are measured side by "
             "side in one run, round by round. `over` says how many runs or rounds each figure is over.", "",
             "## Headline", "", "| figure | measured | over | from |", "|---|---|---|---|"]
    for r in results:
        rows = (r.get("document") or {}).get("headline", [])
        for row in rows:
            lines.append(f"| {row['figure']} | {row['value']} | {row['over']} | `{r['script']}` |")
        if r["status"] != "ok":
            last = r["output"].splitlines()[-1:] or [""]
            lines.append(f"| **`{r['script']}` failed** | {r['error']}: {last[0].replace('|', '/')[:200]} | | "
                         f"`{r['script']}` |")
    for r in results:
        document = r.get("document")
        heading = document["title"] if document else r["script"]
        lines += ["", f"## {heading}", "", f"`{r['command']}`: {r['started']}, {r['seconds']:.0f} s"
                  + (", **failed**" if r["status"] != "ok" else "")
                  + f", on {_short(machine)}; load average {load_text(r['load'])} before and after.", ""]
        if document:
            lines.append(document["markdown"])
        if r["status"] != "ok":
            lines += ["", f"It {r['error']}; the end of its output:", "", "```", r["output"], "```"]
    return "\n".join(lines) + "\n"


def _short(machine: dict) -> str:
    """The machine without its date: 'AMD EPYC 7B13, 2 cores, 24.6 GB, no GPU, torch 2.13.0+cpu'."""
    return text(machine).rsplit(", Python", 1)[0]


def report_json(results: list[dict], machine: dict, seconds: float, quick: bool = False) -> dict:
    return {"machine": machine, "seconds": seconds, "quick": quick,
            "failed": [r["script"] for r in results if r["status"] != "ok"],
            "benchmarks": [{"script": r["script"], "command": r["command"], "started": r["started"],
                            "load": r["load"], "seconds": r["seconds"],
                            "status": r["status"], "error": r["error"],
                            "output": r["output"] if r["status"] != "ok" else None,
                            "title": (r.get("document") or {}).get("title"),
                            "headline": (r.get("document") or {}).get("headline", []),
                            "figures": (r.get("document") or {}).get("figures")} for r in results]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scripts", nargs="*", type=Path, help="benchmark scripts (default: every bench/*.py)")
    parser.add_argument("--out", type=Path, help="folder for report.md and report.json (default bench/results, "
                                                 "or build/bench-quick with --quick)")
    parser.add_argument("--quick", action="store_true", help="each benchmark at its smallest: that they run")
    parser.add_argument("--timeout", type=float, default=600, help="seconds one benchmark may take")
    args = parser.parse_args(argv)
    args.out = args.out or (QUICK_OUT if args.quick else BENCH / "results")
    scripts = [p.resolve() for p in args.scripts] or benchmarks()
    missing = [str(p) for p in scripts if not p.is_file()]
    if missing:
        parser.error(f"no such benchmark script: {', '.join(missing)}")
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-report-") as workdir:
        results = run_all(scripts, Path(workdir), args.timeout, args.quick)
    seconds = time.perf_counter() - started
    machine = describe()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "report.md").write_text(markdown(results, machine, seconds, args.quick), encoding="utf-8")
    (args.out / "report.json").write_text(json.dumps(report_json(results, machine, seconds, args.quick), indent=1)
                                          + "\n", encoding="utf-8")
    failed = [r["script"] for r in results if r["status"] != "ok"]
    print(f"report: {args.out / 'report.md'} and report.json, {seconds:.0f} s"
          + (f"; FAILED: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

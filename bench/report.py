"""`make bench`: every benchmark under bench/, one report.

Runs each benchmark script in its own process (a crash, a hang or a leaked rank
stays with it) with --json, at the rounds chosen below to fit the whole run in
10 minutes on a 2-core machine, then writes report.md and report.json into
--out (default bench/results/): the machine, one headline table, each
benchmark's own section and what each run took. bench/_results.py says what a
script hands over; one that writes only its figures gets its printed output as
its section. A benchmark that fails (exits non-zero, writes no JSON, or runs
out of time) is reported as failed, with the end of its output, and makes this
script exit 1.

    python bench/report.py [SCRIPT ...] [--out bench/results] [--timeout 600]

With no SCRIPT: every bench/*.py but the helpers (bench/_*.py) and this one.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _machine import describe, text

BENCH = Path(__file__).resolve().parent
# Rounds for the report, chosen to fit 10 minutes on 2 cores; the scripts' own defaults are larger.
ARGUMENTS = {
    "launch_latency.py": ["--repeats", "10", "--spawn-repeats", "3"],
    "gloo_link.py": ["--runs", "3"],
    "data_parallel.py": ["--rounds", "15"],
    "model_parallel.py": ["--rounds", "5"],
    "sharded.py": ["--rounds", "10"],
    "pipeline.py": ["--rounds", "3"],
    "long_sequences.py": ["--rounds", "3"],
    "experts.py": ["--rounds", "3"],
    "expert_overlap.py": ["--rounds", "7"],
    "composition.py": ["--rounds", "3"],
    "labs.py": ["--ranks", "4"],
    "grading.py": ["--rounds", "1"],
    "grading_cost.py": ["--quick"],         # the slow kinds take 11 minutes: `python bench/grading_cost.py`
}
# Run in this order (others after, by name): grading.py reuses labs.py's runs of the same notebooks.
ORDER = ["launch_latency.py", "comm_bytes.py", "gloo_link.py", "data_parallel.py", "model_parallel.py",
         "sharded.py", "pipeline.py", "long_sequences.py", "experts.py", "expert_overlap.py", "labs.py",
         "grading.py"]
TAIL_LINES = 15


def benchmarks() -> list[Path]:
    return [p for p in sorted(BENCH.glob("*.py")) if not p.name.startswith("_") and p.name != Path(__file__).name]


def in_order(scripts: list[Path]) -> list[Path]:
    rank = {name: i for i, name in enumerate(ORDER)}
    return sorted(scripts, key=lambda p: (rank.get(p.name, len(ORDER)), p.name))


def arguments(script: Path, json_of: dict[str, Path]) -> list[str]:
    extra = list(ARGUMENTS.get(script.name, []))
    labs_json = json_of.get("labs.py")
    if script.name == "grading.py" and labs_json is not None and labs_json.is_file():
        extra += ["--runs-from", str(labs_json)]
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
    return {"script": script.name, "command": shown,
            "seconds": seconds, "status": "failed" if error else "ok", "document": document, "error": error,
            "output": "\n".join(output[-TAIL_LINES:])}


def run_all(scripts: list[Path], workdir: Path, timeout_s: float) -> list[dict]:
    results, json_of = [], {}
    for script in in_order(scripts):
        json_of[script.name] = workdir / f"{script.stem}.json"
        print(f"== {script.name} ...", end=" ", flush=True)
        result = run_one(script, json_of[script.name], arguments(script, json_of),
                         workdir / script.stem, timeout_s)
        print(f"{result['status']} in {result['seconds']:.0f} s", flush=True)
        results.append(result)
    return results


def markdown(results: list[dict], machine: dict, seconds: float) -> str:
    failed = [r for r in results if r["status"] != "ok"]
    lines = ["# Benchmark report", "",
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
        lines += ["", f"## {heading}", "", f"`{r['command']}`, {r['seconds']:.0f} s"
                  + (", **failed**" if r["status"] != "ok" else "") + ".", ""]
        if document:
            lines.append(document["markdown"])
        if r["status"] != "ok":
            lines += ["", f"It {r['error']}; the end of its output:", "", "```", r["output"], "```"]
    return "\n".join(lines) + "\n"


def report_json(results: list[dict], machine: dict, seconds: float) -> dict:
    return {"machine": machine, "seconds": seconds,
            "failed": [r["script"] for r in results if r["status"] != "ok"],
            "benchmarks": [{"script": r["script"], "command": r["command"], "seconds": r["seconds"],
                            "status": r["status"], "error": r["error"],
                            "output": r["output"] if r["status"] != "ok" else None,
                            "title": (r.get("document") or {}).get("title"),
                            "headline": (r.get("document") or {}).get("headline", []),
                            "figures": (r.get("document") or {}).get("figures")} for r in results]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scripts", nargs="*", type=Path, help="benchmark scripts (default: every bench/*.py)")
    parser.add_argument("--out", type=Path, default=BENCH / "results", help="folder for report.md and report.json")
    parser.add_argument("--timeout", type=float, default=600, help="seconds one benchmark may take")
    args = parser.parse_args(argv)
    scripts = [p.resolve() for p in args.scripts] or benchmarks()
    missing = [str(p) for p in scripts if not p.is_file()]
    if missing:
        parser.error(f"no such benchmark script: {', '.join(missing)}")
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-report-") as workdir:
        results = run_all(scripts, Path(workdir), args.timeout)
    seconds = time.perf_counter() - started
    machine = describe()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "report.md").write_text(markdown(results, machine, seconds), encoding="utf-8")
    (args.out / "report.json").write_text(json.dumps(report_json(results, machine, seconds), indent=1) + "\n",
                                          encoding="utf-8")
    failed = [r["script"] for r in results if r["status"] != "ok"]
    print(f"report: {args.out / 'report.md'} and report.json, {seconds:.0f} s"
          + (f"; FAILED: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

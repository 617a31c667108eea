"""Which of PyTorch's debugging tools work on gloo CPU ranks with the installed torch: each tried on real ranks.

    python bench/debug_tools.py [--json PATH]

Every probe starts 2 gloo ranks (4 for monitored_barrier, so that it has two absent ranks to name), with a 2 s
process group timeout where a rank is to wait in vain, 30 s elsewhere (bench/_debug_ranks.py: the ranks, and why
not course.launch), and reads what they returned, their exit codes and their logs; nothing is hard-coded: each
verdict below is decided from that.
- The Flight Recorder: four collectives and a send/recv, then each rank's buffer (`_dump_fr_trace`, pickled and
  JSON), then an all_reduce on a group from new_group and the groups' config the buffer holds; the buffer on by
  default, and off by TORCH_FR_BUFFER_SIZE=0 or its older name
  TORCH_NCCL_TRACE_BUFFER_SIZE=0; a hang (rank 1 skips an all_reduce, rank 0 times out in it), with
  TORCH_FR_DUMP_TEMP_FILE set to see whether a timeout dumps by itself, each rank's buffer dumped by hand, and the
  analyzer (torch.distributed.flight_recorder.fr_trace's main, as `python -m ...fr_trace DIR` runs it) on those
  dumps as written, then with each group's name filled in from the entries (_named_groups says why).
- TORCH_DISTRIBUTED_DEBUG=DETAIL against unset: rank 0 all-reduces 4 floats, rank 1 5 floats, or broadcasts.
- monitored_barrier, 4 ranks, ranks 1 and 3 absent, wait_all_ranks=True.
- CommDebugMode around a DTensor program and around a plain dist.all_reduce; torch.profiler (CPU) around four
  collectives, its chrome trace's names for them.
- NCCL only: not run (no GPU, no NCCL in a CPU build): the installed ProcessGroupNCCL.hpp's switches, by line.
The whole run takes about 30 s on 2 cores; every probe is bounded by its timeout, its ranks reaped.
"""
from __future__ import annotations

import argparse
import datetime
import os
import pickle
import re
import shutil
import subprocess
import sys
from pathlib import Path

import _debug_ranks as ranks
import torch
import torch.distributed as dist
from _machine import load_average, load_text
from _results import emit, headline_row

WORKS, PARTLY, NOT = "works", "partly", "not"
#: Where the installed torch keeps ProcessGroupNCCL's switches (headers ship with the wheel).
NCCL_HEADER = Path(torch.__file__).parent / "include/torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp"
NCCL_SWITCHES = ("TORCH_NCCL_DUMP_ON_TIMEOUT", "TORCH_NCCL_DESYNC_DEBUG", "TORCH_NCCL_ENABLE_TIMING",
                 "TORCH_NCCL_ENABLE_MONITORING", "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC", "TORCH_NCCL_PROPAGATE_ERROR")
ANALYZER_TIMEOUT_S = 60.0
NEVER_STARTED = '(never "started" nor "completed")'
COLLECTIVES = ["gloo:all_reduce", "gloo:broadcast", "gloo:all_gather", "gloo:barrier"]


def short(text, limit: int = 220) -> str:
    """One line of an error, its gloo source paths dropped, cut at limit."""
    line = re.sub(r"/\S+/third_party/gloo/", "gloo/", " ".join(str(text).split()))
    return line if len(line) <= limit else line[:limit - 1] + "…"


def _run(fn, world_size, **kwargs) -> dict:
    run = ranks.start(fn, world_size, **kwargs)
    shutil.rmtree(run.pop("folder"), ignore_errors=True)
    return run


def flight_recorder() -> list[dict]:
    default = _run(ranks.fr_records, 2, pg_timeout_s=ranks.UNHURRIED_S)
    found = default["ranks"][0] or {}
    if found.get("api") is None:
        return [{"tool": "Flight Recorder", "verdict": NOT, "figures": default,
                 "evidence": f"torch {torch.__version__} has none of {', '.join(ranks.FR_DUMPS)}"}]
    names = [e["profiling_name"] for e in found["entries"]]
    states = {e["state"] for e in found["entries"]}
    p2p = [e for r in default["ranks"].values() for e in (r or {}).get("entries", []) if e["is_p2p"]]
    rows = [{"tool": "Flight Recorder: records collectives", "figures": default,
             "verdict": WORKS if names == COLLECTIVES else PARTLY if names else NOT,
             "evidence": f"on by default; rank 0's buffer ({found['api']}): " + ", ".join(
                 f"#{e['collective_seq_id']} {e['profiling_name']} {e['input_sizes']}" for e in found["entries"])
             + f"; each with its Python caller ({found['entries'][0]['caller'] if names else None})"},
            {"tool": "Flight Recorder: send/recv", "figures": {"p2p_entries": len(p2p)},
             "verdict": WORKS if p2p else NOT,
             "evidence": f"rank 0 sent 4 floats to rank 1 (dist.send, dist.recv): {len(p2p)} point-to-point "
                         "entries in the two ranks' buffers"},
            {"tool": "Flight Recorder: each call's state", "figures": {},
             "verdict": WORKS if {"started", "completed"} & states else NOT,
             "evidence": f"states of the four finished calls: {sorted(states)} "
                         f"{'' if {'started', 'completed'} & states else NEVER_STARTED}; retired, as read: "
                         f"{sorted({e['retired'] for e in found['entries']})}"}]
    grouped = found["with_new_group"]
    rows.append({"tool": "Flight Recorder: each group's config (pg_config)", "figures": grouped,
                 "verdict": WORKS if set(map(str, grouped["pg_config"])) >= {g[0] for g in grouped["groups"]} else NOT,
                 "evidence": f"the entries name the groups {grouped['groups']}; pg_config before new_group: "
                             f"{found['pg_config']}, after: {grouped['pg_config']}"})
    off = {}
    for variable in ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"):
        run = _run(ranks.fr_records, 2, env={variable: "0"}, pg_timeout_s=ranks.UNHURRIED_S)
        off[variable] = len((run["ranks"][0] or {}).get("entries", [None]))
    rows.append({"tool": "Flight Recorder: TORCH_FR_BUFFER_SIZE", "figures": off,
                 "verdict": WORKS if not any(off.values()) and names else NOT,
                 "evidence": "; ".join(f"{variable}=0: {n} entries" for variable, n in off.items())})
    return rows


def _named_groups(source: Path, target: Path) -> None:
    """The dumps with each group's config under the name its entries carry: gloo's dump files the default group's
    config under "" while its entries name it "0", and the analyzer looks configs up by the entries' names."""
    target.mkdir()
    for path in source.iterdir():
        trace = pickle.loads(path.read_bytes())
        names = {tuple(e["process_group"]) for e in trace["entries"]}
        configs = list(trace["pg_config"].values())
        if len(configs) == 1 and len(names) == 1:
            (name, desc), = names
            trace["pg_config"] = {name: {**configs[0], "name": name, "desc": desc}}
        (target / path.name).write_bytes(pickle.dumps(trace))


def analyze(*folders: Path) -> list[dict]:
    """`python -m torch.distributed.flight_recorder.fr_trace FOLDER` on each folder of dumps, side by side:
    {"exit_code", "raised": the last line of its traceback or None, "output": its end} for each."""
    command = [sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace"]
    runs = [subprocess.Popen([*command, str(folder)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            for folder in folders]
    found = []
    for run in runs:
        try:
            output, _ = run.communicate(timeout=ANALYZER_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            run.kill()
            output = run.communicate()[0] + f"\n(killed after {ANALYZER_TIMEOUT_S:g} s)"
        tail = output.strip().splitlines()[-1] if output.strip() else ""
        found.append({"exit_code": run.returncode, "output": output[-3000:],
                      "raised": tail if "Traceback (most recent call last)" in output or run.returncode else None})
    return found


def hang() -> list[dict]:
    if not any(hasattr(torch._C._distributed_c10d, name) for name in ranks.FR_DUMPS):
        return [{"tool": "Flight Recorder: a hang", "verdict": NOT, "figures": {},
                 "evidence": f"torch {torch.__version__} has none of {', '.join(ranks.FR_DUMPS)}"}]
    run = ranks.start(ranks.fr_hang, 2, env={"TORCH_FR_DUMP_TEMP_FILE": "{folder}/auto_trace_"})
    folder = run.pop("folder")
    try:
        waited, skipped = run["ranks"][0] or {}, run["ranks"][1] or {}
        automatic = sorted(p.name for p in folder.rglob("auto_trace_*"))
        _named_groups(folder / "fr", folder / "named")
        as_dumped, named = analyze(folder / "fr", folder / "named")
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    last = {rank: (r["entries"][-1] if r and r.get("entries") else None) for rank, r in run["ranks"].items()}
    shows = (last[0] and last[1] and last[0]["collective_seq_id"] == last[1]["collective_seq_id"] + 1)
    missing = {name: re.search(r"missing ranks: \{1\}", run["output"]) for name, run in
               (("as_dumped", as_dumped), ("named", named))}      # rank 1 is the one that skipped
    return [
        {"tool": "Flight Recorder: a hang", "verdict": WORKS if shows else NOT, "figures": run,
         "evidence": f"rank 0 raised \"{short(waited.get('raised'), 120)}\"; its last entry "
                     f"#{last[0] and last[0]['collective_seq_id']} {last[0] and last[0]['profiling_name']} "
                     f"(state {last[0] and last[0]['state']!r}, retired {last[0] and last[0]['retired']}), "
                     f"rank 1's last #{last[1] and last[1]['collective_seq_id']}"
                     f"{'' if skipped.get('raised') is None else ' (rank 1 raised ' + short(skipped['raised']) + ')'}"},
        {"tool": "Flight Recorder: dump on timeout (TORCH_FR_DUMP_TEMP_FILE)", "figures": {"files": automatic},
         "verdict": WORKS if automatic else NOT,
         "evidence": f"files written by the timeout: {automatic or 'none'}; a rank dumps with _dump_fr_trace"},
        {"tool": "Flight Recorder: the analyzer (fr_trace)", "figures": {"as_dumped": as_dumped, "named": named},
         "verdict": WORKS if missing["as_dumped"] else PARTLY if missing["named"] else NOT,
         "evidence": f"on the dumps as written: {short(as_dumped['raised'] or 'ran', 90)}; with each group's config "
                     f"under its entries' name: {_said(named, missing['named'])}"},
    ]


def _said(analyzer: dict, missing) -> str:
    if missing:
        return missing.group(0)
    return short(analyzer["raised"] or "ran, naming no missing rank: " + analyzer["output"][-100:])


def detail() -> list[dict]:
    outcomes = {}
    for kind in ("shape", "op"):
        for level in ("OFF", "DETAIL"):
            run = _run(ranks.mismatch, 2, args=(kind,), env={"TORCH_DISTRIBUTED_DEBUG": level})
            outcomes[f"{kind}/{level}"] = run
    clear = all(all("Detected mismatch between collectives" in ((r or {}).get("raised") or "")
                    for r in outcomes[f"{kind}/DETAIL"]["ranks"].values()) for kind in ("shape", "op"))
    untouched = all(r and r["result"] == [float(rank + 1)] * len(r["result"]) for kind in ("shape", "op")
                    for rank, r in outcomes[f"{kind}/DETAIL"]["ranks"].items())

    def said(kind, level, rank=0):
        run = outcomes[f"{kind}/{level}"]
        value = run["ranks"][rank]
        if value is None:
            what = [line.split("what():", 1)[1] for line in run["stderr"][rank].splitlines() if "what():" in line]
            return f"exit code {run['exit_codes'][rank]}, \"{short(' '.join(what) or 'no message', 190)}\""
        return f"\"{short(value.get('raised') or 'returned', 120)}\""

    detail_text = (outcomes["shape/DETAIL"]["ranks"][0] or {}).get("raised") or ""
    aspects = [short(((outcomes[f"{kind}/DETAIL"]["ranks"][0] or {}).get("raised") or "").split(
        "differ in the following aspects:")[-1], 60) for kind in ("shape", "op")]
    kept = ", their tensors untouched" if untouched else ""
    return [{"tool": "TORCH_DISTRIBUTED_DEBUG=DETAIL", "verdict": WORKS if clear else NOT, "figures": outcomes,
             "evidence": f"each mismatch raises on both ranks{kept}: \"{short(detail_text, 150)}\", "
                         f"then \"{aspects[0]}\" / \"{aspects[1]}\". Unset, 4 floats against 5: rank 0 "
                         f"{said('shape', 'OFF')}, rank 1 {said('shape', 'OFF', 1)}; all_reduce against broadcast: "
                         f"rank 0 {said('op', 'OFF')}, rank 1 {said('op', 'OFF', 1)}"}]


def barrier() -> list[dict]:
    run = _run(ranks.monitored, 4, args=({1, 3},))
    said = (run["ranks"][0] or {}).get("raised") or ""
    return [{"tool": "monitored_barrier", "figures": run, "verdict": WORKS if "Ranks 1, 3" in said else NOT,
             "evidence": f"4 ranks, 1 and 3 absent: rank 0 raised \"{short(said)}\""}]


def comm_debug_mode() -> list[dict]:
    run = _run(ranks.comm_debug, 2, pg_timeout_s=ranks.UNHURRIED_S)
    found = run["ranks"][0] or {}
    if "dtensor" not in found:
        return [{"tool": "CommDebugMode", "verdict": NOT, "figures": run, "evidence": short(found.get("raised"))}]
    return [{"tool": "CommDebugMode", "figures": run,
             "verdict": WORKS if found["dtensor_total"] and found["plain_total"] else PARTLY,
             "evidence": f"a DTensor matmul made whole and a sum: {found['dtensor']}; a plain dist.all_reduce: "
                         f"{found['plain']}"}]


def profiler() -> list[dict]:
    run = _run(ranks.profiled, 2, pg_timeout_s=ranks.UNHURRIED_S)
    names = (run["ranks"][0] or {}).get("names", [])
    return [{"tool": "torch.profiler (CPU)", "figures": run,
             "verdict": WORKS if any(n.startswith("gloo:") for n in names) else NOT,
             "evidence": f"chrome trace of rank 0, the collectives' events: {', '.join(names) or 'none'}"}]


def nccl_only() -> list[dict]:
    text = NCCL_HEADER.read_text(encoding="utf-8").splitlines() if NCCL_HEADER.is_file() else []
    lines = {name: next((i + 1 for i, line in enumerate(text) if f'"{name}"' in line), None) for name in NCCL_SWITCHES}
    c10d = torch._C._distributed_c10d
    return [{"tool": "NCCL only (read, not run)", "verdict": NOT, "figures": {"lines": lines},
             "evidence": "switches ProcessGroupNCCL reads (the installed header, by line): " + ", ".join(
                 f"{name} (ProcessGroupNCCL.hpp:{line})" for name, line in lines.items() if line)
             + f"; _dump_nccl_trace {'present' if hasattr(c10d, '_dump_nccl_trace') else 'absent'} here, "
               f"NCCL {'available' if dist.is_nccl_available() else 'not built in'}"}]


PROBES = (flight_recorder, hang, detail, barrier, comm_debug_mode, profiler, nccl_only)


def markdown(rows: list[dict], load) -> str:
    table = ["| tool | on gloo | what the ranks gave |", "|---|---|---|"]
    table += [f"| {row['tool']} | {row['verdict']} | {row['evidence'].replace('|', '/')} |" for row in rows]
    return (f"torch {torch.__version__}, gloo on CPU ranks (2; 4 for monitored_barrier), a process group timeout of "
            f"{ranks.PG_TIMEOUT_S:g} s where a rank waits in vain (a hang, a mismatch, an absent rank), "
            f"{ranks.UNHURRIED_S:g} s elsewhere; {os.cpu_count()} cores, load average {load_text(load)} before and "
            f"after, {datetime.date.today()}. `python bench/debug_tools.py`; its module docstring says what each "
            "probe does.\n\n" + "\n".join(table) + "\n")


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="also write the findings here")
    args = parser.parse_args(argv)
    before = load_average()
    rows = [row for probe in PROBES for row in probe()]
    load = [before, load_average()]
    counts = {verdict: sum(row["verdict"] == verdict for row in rows) for verdict in (WORKS, PARTLY, NOT)}
    emit(args.json, title="PyTorch's debugging tools on gloo", markdown=markdown(rows, load),
         headline=[headline_row(f"debugging tools on gloo, torch {torch.__version__}",
                                ", ".join(f"{n} {verdict}" for verdict, n in counts.items()), "1 run")],
         figures={"torch": torch.__version__, "pg_timeout_s": [ranks.PG_TIMEOUT_S, ranks.UNHURRIED_S], "load": load,
                  "counts": counts, "rows": rows})
    return rows


if __name__ == "__main__":
    main()

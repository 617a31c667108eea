"""Covers: bench.composition.

bench/composition.py measures what it says, at --quick's size: lab 9's grid (the solution notebook's
answers) and PyTorch's parts trained side by side on a layout of 4 ranks (pp2×tp2), both with one process's
losses, the times the medians and ratios of the same rounds, the bytes each axis carried by the formula beside
what the sockets wrote, and lab 6's chooser's predictions beside them; and it refuses to run without the lab's
answers. Structure and invariants only, never speed."""
from __future__ import annotations

import json
import types

import composition  # bench/composition.py (the conftest puts bench/ on sys.path)
import pytest


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    """The whole benchmark, once, --quick, over 2 rounds (so that a range and a ratio per round exist)."""
    path = tmp_path_factory.mktemp("bench") / "composition.json"
    composition.main(["--quick", "--rounds", "2", "--json", str(path)])
    return json.loads(path.read_text(encoding="utf-8"))


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_both_grids_are_timed_side_by_side_with_each_axis_s_bytes(report):
    figures = report["figures"]
    assert figures["quick"] and figures["rounds"] == 2 and figures["batch"] == composition.QUICK["batch"]
    assert [row["layout"] for row in figures["layouts"]] == list(composition.QUICK["layouts"])
    for row in figures["layouts"]:
        assert row["ranks"] == 4 and row["time"]["rounds"] == 2
        assert row["time"]["ours_ms"] > 0 and row["time"]["theirs_ms"] > 0
        assert row["time"]["ratio_min"] <= row["time"]["ratio"] <= row["time"]["ratio_max"]
        for name in composition.CONTENDERS:
            carried = {axis for axis, nbytes in row["bytes"][name].items() if nbytes > 0}
            assert carried == {axis for axis, size in row["layout"].items() if size > 1} | (
                {"embedding"} if row["layout"].get("pp", 1) > 1 else set()), (name, row["bytes"][name])
            # the sockets carry at least what the formula counts (gloo adds its headers, and the barriers)
            assert row["sockets"][name] >= sum(row["bytes"][name].values()) > 0, (name, row)
        # the same tied gradient and the same boundary activations: the same bytes, by the formula
        if row["layout"].get("pp", 1) > 1:
            for axis in ("embedding", "pp"):
                assert row["bytes"][composition.CONTENDERS[0]][axis] == row["bytes"][composition.CONTENDERS[1]][axis]
        # lab 6's chooser beside them, and the lab's own formula, which the lab's grid's records meet (but for
        # its answers' few scalar reductions: the loss's token count)
        assert row["predicted"]["seconds"] > 0 and row["predicted"]["sent"]["tp"] > 0
        for axis, nbytes in row["lab_formula"].items():
            assert abs(row["bytes"][composition.CONTENDERS[0]].get(axis, 0.0) - nbytes) <= 0.01 * nbytes + 64, axis
    assert "| layout | ranks | lab 9's grid | PyTorch's parts |" in report["markdown"]
    assert "| layout | what | chooser | lab 9's grid | lab's formula | PyTorch's parts |" in report["markdown"]
    assert [line["figure"] for line in report["headline"]] == [
        f"lab 9's grid / PyTorch's parts, step, {composition.layout_text(sizes)} on 4 ranks"
        for sizes in composition.QUICK["layouts"]]
    assert all(line["over"] == "2 rounds" for line in report["headline"])


def test_a_notebook_without_the_lab_s_answers_is_refused_naming_what_is_missing():
    half = types.SimpleNamespace(grid_groups=lambda *a: None, vocab_parallel_cross_entropy=lambda *a: None)
    with pytest.raises(RuntimeError, match="defines no micro_batch_loss, reduce_gradients, global_grad_norm"):
        composition.lab_answers(half)
    whole = types.SimpleNamespace(**{name: (lambda *a: None) for name in composition.ANSWERS})
    assert sorted(composition.lab_answers(whole)) == sorted(composition.ANSWERS)

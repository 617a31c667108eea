"""Covers: course.check, course.grading.

course.check and course.grading: comparing results with a reference, and storing it.

check.assert_close passes within the dtype's tolerance and fails just outside
it, with a message that names the result, the rank, how many elements differ,
the largest difference and where; messages_only and ring_neighbours_only say
which rank sent what it should not; grading stores reference values as JSON
that decodes bit for bit, and `Reference` records them or compares with them,
and seeds the hidden tests' generators.
"""
import json
import math
import random
from pathlib import Path

import pytest
import torch

import course
from course import check, comm, grading
from course.launch import RankResults


def fails(actual, expected, name="result", **kwargs):
    """The message assert_close raises with (and that it raises at all)."""
    with pytest.raises(AssertionError) as caught:
        check.assert_close(actual, expected, name, **kwargs)
    return str(caught.value)


# --------------------------------------------------------------------------
# check.tolerance and the tolerance boundaries
# --------------------------------------------------------------------------

def test_tolerance_per_dtype():
    assert check.tolerance(torch.float32) == (1e-5, 1e-6)
    assert check.tolerance(torch.float64) == (1e-12, 1e-14)
    for exact in (torch.int64, torch.int32, torch.bool, torch.uint8):
        assert check.tolerance(exact) == (0.0, 0.0), exact


def test_equal_tensors_pass():
    t = torch.randn(4, 5, generator=torch.Generator().manual_seed(0))
    check.assert_close(t, t.clone(), "t")
    check.assert_close(t.double(), t.double().clone(), "t")
    check.assert_close(torch.tensor(3.0), torch.tensor(3.0), "scalar")
    check.assert_close(torch.empty(0, 3), torch.empty(0, 3), "empty")


# (dtype, expected, inside, outside): |inside - expected| is just under
# atol + rtol * |expected|, |outside - expected| just over it.
BOUNDARIES = [
    # float32: 1e-6 + 1e-5 * 100 = 1.001e-3 (rtol dominates)
    (torch.float32, 100.0, 100.0009, 100.0012),
    # float32 at 0: only atol = 1e-6 counts
    (torch.float32, 0.0, 0.9e-6, 1.1e-6),
    # float64: 1e-14 + 1e-12 * 1 = 1.01e-12
    (torch.float64, 1.0, 1.0 + 0.9e-12, 1.0 + 1.1e-12),
    # float64 at 0: only atol = 1e-14 counts
    (torch.float64, 0.0, 0.9e-14, 1.1e-14),
]


@pytest.mark.parametrize("dtype, expected, inside, outside", BOUNDARIES)
def test_a_difference_just_inside_passes_and_just_outside_fails(dtype, expected, inside, outside):
    want = torch.tensor([expected, 1.0], dtype=dtype)
    check.assert_close(torch.tensor([inside, 1.0], dtype=dtype), want, "x")
    message = fails(torch.tensor([outside, 1.0], dtype=dtype), want, "x")
    assert "1 of 2 elements differ" in message, message
    assert f"({dtype})" in message, message


def test_explicit_rtol_and_atol_replace_the_defaults():
    want = torch.tensor([1.0, 2.0])
    got = torch.tensor([1.05, 2.0])
    check.assert_close(got, want, "x", atol=0.1)
    check.assert_close(got, want, "x", rtol=0.1)
    message = fails(got, want, "x", rtol=0.01, atol=0.02)
    assert "allowed: |got - expected| <= 0.02 + 0.01 * |expected| (torch.float32)" in message, message


# --------------------------------------------------------------------------
# What a failure says
# --------------------------------------------------------------------------

def test_the_failure_message_names_everything():
    want = torch.zeros(2, 3)
    want[0, 0] = 0.1
    want[1, 2] = 0.5
    message = fails(torch.zeros(2, 3), want, "grads", rank=1)
    assert message == (
        "grads on rank 1: 2 of 6 elements differ; the largest difference is 0.5 at [1, 2] "
        "(got 0.0, expected 0.5); allowed: |got - expected| <= 1e-06 + 1e-05 * |expected| (torch.float32)"
    ), message


def test_without_a_rank_the_message_does_not_mention_one():
    message = fails(torch.tensor([1.0, 2.0]), torch.tensor([1.0, 3.0]), "loss")
    assert message.startswith("loss: 1 of 2 elements differ"), message
    assert "rank" not in message, message
    assert "at [1]" in message and "(got 2.0, expected 3.0)" in message, message


def test_a_zero_dim_failure_has_no_index():
    message = fails(torch.tensor(2.0), torch.tensor(1.0), "loss")
    assert "the largest difference is 1 (got 2.0, expected 1.0)" in message, message
    assert " at [" not in message, message


def test_the_largest_difference_is_reported_not_the_first():
    want = torch.zeros(3, 4)
    got = want.clone()
    got[0, 1] = 0.01
    got[2, 3] = -0.3
    got[1, 0] = 0.2
    message = fails(got, want, "w")
    assert "3 of 12 elements differ" in message, message
    assert "the largest difference is 0.3 at [2, 3] (got -0.3, expected 0.0)" in message, message


def test_shape_mismatch_hints_at_a_transpose():
    message = fails(torch.zeros(3, 2), torch.zeros(2, 3), "weight", rank=0)
    assert message == "weight on rank 0: shape (3, 2), expected (2, 3) (transposed?)", message


def test_shape_mismatch_with_the_same_number_of_elements_hints_at_a_reshape():
    message = fails(torch.zeros(6), torch.zeros(2, 3), "weight")
    assert message.startswith("weight: shape (6,), expected (2, 3) (same number of elements"), message
    assert "transposed" not in message, message


def test_shape_mismatch_with_a_different_size_has_no_hint():
    message = fails(torch.zeros(4), torch.zeros(2, 3), "weight")
    assert message == "weight: shape (4,), expected (2, 3)", message


def test_dtype_mismatch():
    message = fails(torch.zeros(3, dtype=torch.float64), torch.zeros(3), "x")
    assert message == "x: dtype torch.float64, expected torch.float32", message


def test_none_asks_whether_the_function_returns():
    message = fails(None, torch.zeros(2, 3), "out", rank=2)
    assert message == ("out on rank 2: got None, expected a tensor of shape (2, 3); "
                       "does the function return its result?"), message


def test_a_non_tensor_is_named_by_type():
    message = fails([1.0, 2.0], torch.zeros(2), "out")
    assert message == "out: got list, expected a torch.Tensor of shape (2,)", message


def test_a_python_number_matches_a_zero_dim_tensor():
    check.assert_close(0.5, torch.tensor(0.5), "loss")
    assert "got 0.6, expected 0.5" in fails(0.6, torch.tensor(0.5), "loss")


def test_nan_on_one_side_fails_and_on_both_sides_passes():
    nan = float("nan")
    check.assert_close(torch.tensor([1.0, nan]), torch.tensor([1.0, nan]), "x")
    for got, want in (([1.0, nan], [1.0, 2.0]), ([1.0, 2.0], [1.0, nan])):
        message = fails(torch.tensor(got), torch.tensor(want), "x")
        assert "1 of 2 elements differ" in message, message
        assert "the largest difference is inf at [1]" in message, message


def test_integer_tensors_compare_exactly():
    check.assert_close(torch.tensor([1, 2, 3]), torch.tensor([1, 2, 3]), "counts")
    message = fails(torch.tensor([1, 2, 4]), torch.tensor([1, 2, 3]), "counts")
    assert message == ("counts: 1 of 3 elements differ; the largest difference is 1 at [2] "
                       "(got 4, expected 3); allowed: exact equality (torch.int64)"), message
    # Beyond float64's 53 bits: still not equal.
    fails(torch.tensor([2**53 + 1]), torch.tensor([2**53]), "big")


def test_bool_tensors_compare_exactly():
    check.assert_close(torch.tensor([True, False]), torch.tensor([True, False]), "mask")
    assert "exact equality (torch.bool)" in fails(torch.tensor([True, False]), torch.tensor([True, True]), "mask")


# --------------------------------------------------------------------------
# Mappings, sequences, numbers, and what cannot be compared
# --------------------------------------------------------------------------

def test_mappings_compare_key_by_key():
    want = {"w": torch.ones(2), "b": torch.zeros(1)}
    check.assert_close({"b": torch.zeros(1), "w": torch.ones(2)}, want, "params")
    message = fails({"w": torch.ones(2), "c": torch.zeros(1)}, want, "params", rank=3)
    assert message == "params on rank 3: keys differ; missing ['b'], unexpected ['c']", message
    message = fails({"w": torch.ones(2), "b": torch.ones(1)}, want, "params")
    assert message.startswith("params['b']: 1 of 1 elements differ"), message


def test_nested_keys_and_indices_are_named():
    want = {"layers": [{"w": torch.ones(2)}, {"w": torch.ones(2)}]}
    got = {"layers": [{"w": torch.ones(2)}, {"w": torch.tensor([1.0, 5.0])}]}
    message = fails(got, want, "state", rank=1)
    assert message.startswith("state['layers'][1]['w'] on rank 1: 1 of 2 elements differ"), message


def test_a_mapping_expected_but_something_else_given():
    message = fails([torch.ones(2)], {"w": torch.ones(2)}, "params")
    assert message == "params: got list, expected a dict with keys ['w']", message


def test_sequences_compare_item_by_item():
    want = [torch.ones(2), torch.zeros(3)]
    check.assert_close((torch.ones(2), torch.zeros(3)), want, "grads")
    assert fails([torch.ones(2)], want, "grads") == "grads: 1 items, expected 2"
    message = fails([torch.ones(2), torch.ones(3)], want, "grads", rank=0)
    assert message.startswith("grads[1] on rank 0: 3 of 3 elements differ"), message
    message = fails(torch.ones(2), want, "grads")
    assert message == "grads: got Tensor, expected a sequence of 2", message
    message = fails("ab", want, "grads")
    assert message == "grads: got str, expected a sequence of 2", message


def test_a_python_float_expected():
    check.assert_close(0.25, 0.25, "loss")
    check.assert_close(torch.tensor(0.25, dtype=torch.float64), 0.25, "loss")
    check.assert_close(0.25 + 1e-14, 0.25, "loss")  # within float64's tolerance
    message = fails(0.3, 0.25, "loss", rank=1)
    assert message.startswith("loss on rank 1: 1 of 1 elements differ"), message
    assert "(got 0.3, expected 0.25)" in message and "(torch.float64)" in message, message
    assert "got None" in fails(None, 0.25, "loss")


@pytest.mark.parametrize("expected", [{1, 2}, object(), b"bytes"])
def test_an_unsupported_expected_type_raises_type_error(expected):
    with pytest.raises(TypeError, match="cannot compare"):
        check.assert_close(expected, expected, "odd")


def test_strings_and_none_must_be_equal():
    """Names (a grid's groups, a scheme's choice) and absent values are checked exactly."""
    check.assert_close(["data", None], ["data", None], "choices")
    with pytest.raises(AssertionError, match=r"^choices\[0\]: got 'model', expected 'data'$"):
        check.assert_close(["model", None], ["data", None], "choices")
    with pytest.raises(AssertionError, match=r"choices\[1\]: got 0.5, expected None"):
        check.assert_close(["data", 0.5], ["data", None], "choices")


# --------------------------------------------------------------------------
# check.messages_only and check.ring_neighbours_only, on a run's records
# --------------------------------------------------------------------------

def record(rank, op, peer=None, nbytes=8):
    return comm.CommRecord(rank=rank, op=op, shape=(1,), dtype="float64", nbytes=nbytes, group_size=3, peer=peer,
                           async_op=op.startswith("i"), algorithm="direct", predicted=nbytes)


def run_of(*records, ranks=3):
    """What course.launch returns for a run of `ranks` ranks that made these calls."""
    return RankResults({rank: None for rank in range(ranks)}, ranks, comm.CommLog(records), "gloo",
                       ["cpu"] * ranks, {})


RING_OF_3 = [record(rank, op, peer=(rank + step) % 3)
             for rank in range(3) for op, step in (("isend", 1), ("recv", -1), ("send", 1), ("irecv", -1))]


def test_messages_only_passes_sends_and_receives_and_names_the_ranks_of_a_collective():
    check.messages_only(run_of(*RING_OF_3), "ring_all_reduce")
    check.messages_only(run_of(), "ring_all_reduce")          # one rank: nothing sent at all
    with pytest.raises(AssertionError) as caught:
        check.messages_only(run_of(*RING_OF_3, record(2, "all_reduce"), record(1, "broadcast", 0),
                                   record(1, "all_reduce")), "naive_all_reduce")
    assert str(caught.value) == ("naive_all_reduce must be built from send/recv/isend/irecv alone; it called "
                                 "['all_reduce', 'broadcast'] on ranks 1, 2")
    with pytest.raises(AssertionError, match=r"it called \['barrier'\] on rank 0$"):
        check.messages_only(run_of(record(0, "barrier")), "ring_all_gather")


@pytest.mark.parametrize("wrong, message", [
    (record(1, "send", peer=0, nbytes=24),
     "3 ranks: ring_reduce_scatter on rank 1 sent 24 bytes to rank 0; in a ring each rank sends only to its "
     "right neighbour, (rank + 1) % N = 2"),
    (record(0, "irecv", peer=1),
     "3 ranks: ring_reduce_scatter on rank 0 received from rank 1; in a ring each rank receives only from its "
     "left neighbour, (rank - 1) % N = 2"),
])
def test_ring_neighbours_only_passes_a_ring_and_names_the_rank_that_left_it(wrong, message):
    check.ring_neighbours_only(run_of(*RING_OF_3), "ring_reduce_scatter")
    with pytest.raises(AssertionError) as caught:
        check.ring_neighbours_only(run_of(*RING_OF_3, wrong), "ring_reduce_scatter")
    assert str(caught.value) == message


def test_ring_neighbours_only_counts_the_ring_in_ranks_and_ignores_collectives():
    """On 2 ranks the right and the left neighbour are one rank; a collective has no peer to check."""
    check.ring_neighbours_only(run_of(record(0, "send", 1), record(1, "recv", 0), record(0, "all_reduce"),
                                      ranks=2), "ring_all_gather")
    with pytest.raises(AssertionError, match=r"^4 ranks: ring_all_gather on rank 3 sent 8 bytes to rank 2; .* = 0$"):
        check.ring_neighbours_only(run_of(record(3, "isend", 2), ranks=4), "ring_all_gather")


@pytest.mark.parametrize("structure_check", [check.messages_only, check.ring_neighbours_only])
def test_the_structure_checks_refuse_anything_but_a_run(structure_check):
    with pytest.raises(TypeError, match=rf"^{structure_check.__name__} reads what the ranks sent: pass what "
                                        r"course.launch returned, not a list$"):
        structure_check(RING_OF_3, "ring_all_reduce")


# --------------------------------------------------------------------------
# grading.encode / decode
# --------------------------------------------------------------------------

def through_json(value):
    """encode -> strict JSON text -> decode, as a reference file stores it."""
    return grading.decode(json.loads(json.dumps(grading.encode(value), allow_nan=False)))


def same_bits(a, b):
    assert isinstance(b, torch.Tensor), type(b)
    assert a.dtype == b.dtype and a.shape == b.shape, (a.dtype, b.dtype, a.shape, b.shape)
    if a.is_floating_point():
        ints = {2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
        return torch.equal(a.view(ints), b.view(ints))
    return torch.equal(a, b)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_float_tensors_round_trip_bit_for_bit(dtype):
    info = torch.finfo(dtype)
    values = [0.1, 1 / 3, -2 / 3, 1e-7, 123456.789, -0.0, 0.0, info.max, info.tiny,
              info.tiny / 2 ** 10]  # the last one subnormal
    t = torch.tensor(values, dtype=dtype)
    t = torch.cat([t, torch.randn(50, generator=torch.Generator().manual_seed(0), dtype=dtype)])
    back = through_json(t)
    assert same_bits(t, back), (t - back).abs().max()
    assert same_bits(t.reshape(2, 5, 6), through_json(t.reshape(2, 5, 6)))


@pytest.mark.parametrize("shape", [(), (0,), (2, 0, 3), (1,), (3, 1, 2)])
def test_shapes_round_trip(shape):
    t = torch.arange(math.prod(shape), dtype=torch.float64).reshape(shape) / 7
    back = through_json(t)
    assert back.shape == t.shape, (back.shape, t.shape)
    assert same_bits(t, back)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.bool, torch.float16, torch.bfloat16])
def test_other_dtypes_round_trip(dtype):
    if dtype == torch.int64:
        t = torch.tensor([0, -1, 2**62 + 1, -2**63, 2**63 - 1])
    elif dtype == torch.bool:
        t = torch.tensor([[True, False], [False, True]])
    else:
        t = (torch.arange(-6, 6) / 3).to(dtype)
    back = through_json(t)
    assert same_bits(t, back), (t, back)


def test_nan_and_inf_round_trip_in_tensors_and_as_floats():
    t = torch.tensor([float("nan"), float("inf"), -float("inf"), 1.5])
    back = through_json(t)
    assert back.dtype == torch.float32
    assert torch.isnan(back[0]) and back[1] == float("inf") and back[2] == -float("inf") and back[3] == 1.5, back
    nan, inf, minus_inf = through_json([float("nan"), float("inf"), -float("inf")])
    assert math.isnan(nan) and inf == math.inf and minus_inf == -math.inf, (nan, inf, minus_inf)


def test_nested_values_round_trip_with_their_types():
    value = {
        "params": {"w": torch.tensor([[0.1, 0.2]]), "b": torch.tensor([1 / 3], dtype=torch.float64)},
        "losses": [2.5, 1.25, 3.0],
        "steps": 7,
        "flags": [True, False, None],
        "name": "train_step",
        "nested": [[{"deep": torch.tensor(5)}]],
        "empty": {},
    }
    back = through_json(value)
    assert set(back) == set(value)
    assert same_bits(value["params"]["w"], back["params"]["w"])
    assert same_bits(value["params"]["b"], back["params"]["b"])
    assert back["losses"] == [2.5, 1.25, 3.0] and all(type(x) is float for x in back["losses"]), back["losses"]
    assert back["steps"] == 7 and type(back["steps"]) is int, back["steps"]
    assert back["flags"] == [True, False, None] and back["flags"][0] is True, back["flags"]
    assert back["name"] == "train_step"
    assert same_bits(torch.tensor(5), back["nested"][0][0]["deep"])
    assert back["empty"] == {}


def test_a_string_that_looks_like_nan_stays_a_string():
    assert through_json("nan") == "nan"
    assert through_json(["inf", float("inf")])[0] == "inf"


@pytest.mark.parametrize("value", [torch.zeros(2, dtype=torch.complex64), object(), {1, 2}, b"bytes",
                                   {"ok": [1, object()]}])
def test_encode_rejects_what_it_cannot_store(value):
    with pytest.raises(TypeError, match="cannot store"):
        grading.encode(value)


# --------------------------------------------------------------------------
# grading.write / read
# --------------------------------------------------------------------------

def test_write_and_read_round_trip(tmp_path):
    values = {"b/loss": 0.1, "a/params": {"w": torch.tensor([0.1, 1 / 3])}, "c/steps": [1, 2]}
    path = tmp_path / "sub" / "01_lab.json"
    grading.write(path, "01_lab", values)
    stored = json.loads(path.read_text(encoding="utf-8"))
    assert stored["format"] == grading.FORMAT and stored["lab"] == "01_lab", stored
    assert list(stored["values"]) == ["a/params", "b/loss", "c/steps"], "keys are written sorted"
    back = grading.read(path)
    assert set(back) == set(values)
    assert back["b/loss"] == 0.1 and back["c/steps"] == [1, 2]
    assert same_bits(values["a/params"]["w"], back["a/params"]["w"])
    assert [p.name for p in path.parent.iterdir()] == ["01_lab.json"], "no temporary file is left behind"


def test_write_puts_one_value_per_line(tmp_path):
    path = tmp_path / "lab.json"
    grading.write(path, "lab", {"x": 1, "y": 2, "z": 3})
    lines = path.read_text(encoding="utf-8").splitlines()
    assert [line.split(":")[0].strip() for line in lines[1:4]] == ['"x"', '"y"', '"z"'], lines


@pytest.mark.parametrize("fmt", [1, None, "2"])
def test_read_rejects_another_format(tmp_path, fmt):
    path = tmp_path / "lab.json"
    grading.write(path, "lab", {"x": 1.0})
    stored = json.loads(path.read_text(encoding="utf-8"))
    stored["format"] = fmt
    path.write_text(json.dumps(stored), encoding="utf-8")
    with pytest.raises(ValueError, match="python -m grader reference"):
        grading.read(path)


# --------------------------------------------------------------------------
# grading.Reference
# --------------------------------------------------------------------------

@pytest.fixture
def recorded(tmp_path, monkeypatch):
    """A folder holding lab_x.json with three values, recorded through Reference.check."""
    monkeypatch.delenv(grading.DIR_ENV, raising=False)
    monkeypatch.setenv(grading.RECORD_ENV, str(tmp_path))
    ref = grading.Reference("lab_x")
    assert ref.recording
    ref.check("train_step/params", {"w": torch.tensor([0.1, 0.2]), "b": torch.tensor([1 / 3])})
    ref.check("loss", 0.75)
    ref.check("counts", torch.tensor([1, 2, 3]))
    monkeypatch.delenv(grading.RECORD_ENV)
    monkeypatch.setenv(grading.DIR_ENV, str(tmp_path))
    return tmp_path


def test_recording_accumulates_values_in_one_file(recorded):
    assert [p.name for p in recorded.iterdir()] == ["lab_x.json"]
    stored = grading.read(recorded / "lab_x.json")
    assert sorted(stored) == ["counts", "loss", "train_step/params"], sorted(stored)
    assert stored["loss"] == 0.75
    assert torch.equal(stored["counts"], torch.tensor([1, 2, 3]))
    assert same_bits(stored["train_step/params"]["w"], torch.tensor([0.1, 0.2]))


def test_recording_a_key_again_replaces_it(recorded, monkeypatch):
    monkeypatch.setenv(grading.RECORD_ENV, str(recorded))
    grading.Reference("lab_x").check("loss", 0.5)
    stored = grading.read(recorded / "lab_x.json")
    assert stored["loss"] == 0.5 and len(stored) == 3, stored


def test_check_passes_for_the_recorded_values(recorded):
    ref = grading.Reference("lab_x")
    assert not ref.recording
    assert ref.path() == recorded / "lab_x.json"
    ref.check("train_step/params", {"w": torch.tensor([0.1, 0.2]), "b": torch.tensor([1 / 3])})
    ref.check("loss", 0.75)
    ref.check("counts", torch.tensor([1, 2, 3]))
    ref.check("loss", 0.75 + 1e-14)  # within tolerance


def test_check_fails_for_a_different_value_and_names_it(recorded):
    ref = grading.Reference("lab_x")
    with pytest.raises(AssertionError, match=r"train_step/params\['w'\] on rank 1: 1 of 2 elements differ"):
        ref.check("train_step/params", {"w": torch.tensor([0.1, 0.3]), "b": torch.tensor([1 / 3])}, rank=1)
    with pytest.raises(AssertionError, match=r"^final loss: "):
        ref.check("loss", 0.8, name="final loss")
    with pytest.raises(AssertionError, match="exact equality"):
        ref.check("counts", torch.tensor([1, 2, 4]))
    # Nothing was recorded while comparing.
    assert grading.read(recorded / "lab_x.json")["loss"] == 0.75


def test_a_stored_value_from_another_machine_is_held_to_float32s_tolerance_and_counts_stay_exact(
        recorded, monkeypatch):
    """Stored values may come from another instruction set: float64 values agree to about 1e-7
    there, not to float64's 1e-12 (course.grading.ACROSS_MACHINES); a count off by one never does."""
    monkeypatch.setenv(grading.RECORD_ENV, str(recorded))
    writer = grading.Reference("lab_x")
    writer.check("trained", torch.tensor([0.37662189310676236, 1e-9], dtype=torch.float64))
    writer.check("bytes", 93_704_192)
    monkeypatch.delenv(grading.RECORD_ENV)
    ref = grading.Reference("lab_x")
    ref.check("trained", torch.tensor([0.3766219359702047, 1e-9 + 4e-7], dtype=torch.float64))  # 1.1e-7 relative
    with pytest.raises(AssertionError, match=r"allowed: \|got - expected\| <= 1e-06 \+ 1e-05"):
        ref.check("trained", torch.tensor([0.3767, 1e-9], dtype=torch.float64))
    with pytest.raises(AssertionError, match="exact equality"):
        ref.check("counts", torch.tensor([1, 2, 4]))
    with pytest.raises(AssertionError, match="1 of 1 elements differ"):
        ref.check("bytes", 93_704_193)
    # The judge's own comparisons keep each check's tolerance: at_least is only for stored values.
    with pytest.raises(AssertionError):
        check.assert_close(torch.tensor([0.3766219359702047], dtype=torch.float64),
                           torch.tensor([0.37662189310676236], dtype=torch.float64), "same machine")


def test_a_missing_key_says_how_to_regenerate(recorded):
    with pytest.raises(KeyError, match="python -m grader reference") as caught:
        grading.Reference("lab_x").check("no/such/key", 1.0)
    assert "no/such/key" in str(caught.value)


def test_a_missing_file_raises_file_not_found(tmp_path, monkeypatch):
    monkeypatch.delenv(grading.RECORD_ENV, raising=False)
    monkeypatch.setenv(grading.DIR_ENV, str(tmp_path))
    with pytest.raises(FileNotFoundError, match="python -m grader reference"):
        grading.Reference("absent_lab").check("x", 1.0)


def test_an_empty_record_variable_does_not_record(tmp_path, monkeypatch):
    monkeypatch.setenv(grading.RECORD_ENV, "")
    monkeypatch.setenv(grading.DIR_ENV, str(tmp_path))
    ref = grading.Reference("lab_y")
    assert not ref.recording
    with pytest.raises(FileNotFoundError):
        ref.check("x", 1.0)
    assert list(tmp_path.iterdir()) == []


def test_default_dir_is_the_graders_reference_folder(monkeypatch):
    monkeypatch.delenv(grading.DIR_ENV, raising=False)
    assert grading.default_dir() == Path(course.__file__).resolve().parent.parent / "grader" / "reference"


def test_under_grader_follows_nbgrader_execution(monkeypatch):
    monkeypatch.delenv("NBGRADER_EXECUTION", raising=False)
    assert grading.under_grader() is False
    monkeypatch.setenv("NBGRADER_EXECUTION", "autograde")
    assert grading.under_grader() is True
    monkeypatch.setenv("NBGRADER_EXECUTION", "")
    assert grading.under_grader() is False


def draws(generator):
    return torch.randn(6, generator=generator, dtype=torch.float64)


@pytest.mark.parametrize("offset", [0, 1, 9])
def test_the_seeded_generators_draw_as_the_seed_they_replace(monkeypatch, offset):
    """REFERENCE.generator(offset) and REFERENCE.random(offset) draw what torch.Generator().manual_seed(seed() +
    offset) and random.Random(seed() + offset) drew, so the stored reference values stay valid."""
    monkeypatch.delenv(grading.RECORD_ENV, raising=False)
    monkeypatch.delenv(grading.JUDGE_ENV, raising=False)
    ref = grading.Reference("lab_x")
    seed = ref.seed()
    assert seed == grading.STORED_SEED
    assert torch.equal(draws(ref.generator(offset)), draws(torch.Generator().manual_seed(seed + offset)))
    ours, theirs = ref.random(offset), random.Random(seed + offset)
    assert [ours.randint(1, 99) for _ in range(8)] == [theirs.randint(1, 99) for _ in range(8)]


def test_an_offset_gives_another_stream_of_the_same_seed(monkeypatch):
    monkeypatch.delenv(grading.RECORD_ENV, raising=False)
    monkeypatch.delenv(grading.JUDGE_ENV, raising=False)
    ref = grading.Reference("lab_x")
    assert not torch.equal(draws(ref.generator(0)), draws(ref.generator(1)))
    assert torch.equal(draws(ref.generator(1)), draws(torch.Generator().manual_seed(grading.STORED_SEED + 1)))
    assert ref.random(0).random() != ref.random(1).random()


def test_the_seeded_generators_follow_a_recordings_seed_and_the_judges(tmp_path, monkeypatch):
    """While recording, the seed is COURSE_REFERENCE_SEED's; while grading, the one the judge tells."""
    monkeypatch.delenv(grading.JUDGE_ENV, raising=False)
    monkeypatch.setenv(grading.RECORD_ENV, str(tmp_path))
    monkeypatch.setenv(grading.SEED_ENV, "1234")
    ref = grading.Reference("lab_x")
    assert torch.equal(draws(ref.generator(2)), draws(torch.Generator().manual_seed(1236)))
    assert ref.random(2).random() == random.Random(1236).random()
    asked = []
    monkeypatch.setattr(grading, "_ask", lambda socket, request: asked.append(request) or {"seed": 4242})
    monkeypatch.setenv(grading.JUDGE_ENV, str(tmp_path / "judge.sock"))
    assert torch.equal(draws(ref.generator()), draws(torch.Generator().manual_seed(4242)))
    assert ref.random(5).random() == random.Random(4247).random()
    assert asked == [{"op": "seed", "lab": "lab_x"}] * 2


@pytest.mark.parametrize("offset", [1.5, True, "1", None])
def test_a_seed_offset_that_is_no_whole_number_is_refused(offset):
    with pytest.raises(TypeError, match=r"a seed's offset is a whole number \(seed\(\) \+ offset\), got "):
        grading.Reference("lab_x").generator(offset)
    with pytest.raises(TypeError, match="a seed's offset is a whole number"):
        grading.Reference("lab_x").random(offset)


def test_fresh_seeds_are_31_bit_and_differ():
    seeds = [grading.fresh_seed() for _ in range(20)]
    assert all(type(s) is int and 0 <= s < 2**31 for s in seeds), seeds
    assert len(set(seeds)) > 1, seeds


def test_large_integers_and_unusual_tolerances_are_shown_exactly():
    message = fails(torch.tensor([1000001]), torch.tensor([1000000]), "count")
    assert "(got 1000001, expected 1000000)" in message, message
    message = fails(torch.tensor([1.0]), torch.tensor([2.0]), "x", rtol=1.5e-5, atol=0.0)
    assert "<= 0 + 1.5e-05 * |expected|" in message, message


def test_a_python_float_compares_in_the_results_dtype():
    check.assert_close(torch.tensor(0.1), 0.1, "loss")  # float32 0.1 against the float 0.1
    assert "dtype" not in fails(torch.tensor(0.5), 0.6, "loss")


def parts_gathered():
    """On every rank of 4: its own block of a 2 x 6 tensor, gathered over the world and over
    the ranks of its parity."""
    rank = torch.distributed.get_rank()
    block = torch.full((2, 3), float(rank))
    parity = [torch.distributed.new_group([0, 2]), torch.distributed.new_group([1, 3])][rank % 2]
    return check.gathered(block, 0), check.gathered(block, 1, parity)


def test_gathered_stacks_every_ranks_part_in_group_order():
    for rank, (world, group) in enumerate(course.launch(parts_gathered, 4)):
        assert torch.equal(world, torch.arange(4.0).repeat_interleave(2)[:, None].expand(8, 3))
        mine = [r for r in range(4) if r % 2 == rank % 2]
        assert torch.equal(group, torch.tensor(mine, dtype=torch.float32).repeat_interleave(3).expand(2, 6))

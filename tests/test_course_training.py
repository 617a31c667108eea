"""Covers: course.data, course.models, course.throughput, course.plots, course.legible.

course.data, course.models, course.throughput and course.plots, on the CPU.

The digits split and the batches are reproducible from their seed; the
models have the named layers the labs walk, and seeding them leaves the
global random state alone; a throughput sweep over a fake step reports the
median and the spread of exactly the timed steps, and `lesson` says what a
hand-built curve shows; the plots draw what they are given.
"""
import itertools

import matplotlib.pyplot as plt
import pandas as pd
import pytest
import torch
from torch import nn

from course import data, legible, mfu, models, plots, throughput


@pytest.fixture(scope="module")
def digits():
    return data.digits()


# --------------------------------------------------------------------------
# course.data
# --------------------------------------------------------------------------

def test_digits_split_shapes_and_values(digits):
    assert digits.train_x.shape == (1438, 64), digits.train_x.shape
    assert digits.test_x.shape == (359, 64), digits.test_x.shape
    assert digits.train_y.shape == (1438,) and digits.test_y.shape == (359,)
    assert digits.train_x.dtype == torch.float32
    assert digits.train_y.dtype == torch.int64
    for x in (digits.train_x, digits.test_x):
        assert x.min() >= 0 and x.max() <= 1, (x.min(), x.max())
        assert x.max() == 1, "16 scales to 1"
    for y in (digits.train_y, digits.test_y):
        assert set(y.tolist()) == set(range(10)), sorted(set(y.tolist()))


def test_digits_train_and_test_together_are_the_whole_set(digits):
    from sklearn.datasets import load_digits

    raw = load_digits()
    split = torch.cat([digits.train_x, digits.test_x]).mul(16).round().long()
    labels = torch.cat([digits.train_y, digits.test_y])
    got = sorted(zip(labels.tolist(), map(tuple, split.tolist())))
    want = sorted(zip(raw.target.tolist(), map(tuple, raw.data.astype(int).tolist())))
    assert got == want, "the split is a permutation of the 1797 digits, each label with its image"


def test_the_digits_read_from_sklearns_file_are_its_loaders_bit_for_bit(monkeypatch):
    from sklearn.datasets import load_digits

    raw = load_digits()
    for layout in ("sklearn's", "another"):
        if layout == "another":     # a layout without the file: sklearn's own loader instead
            monkeypatch.setattr(data.importlib.util, "find_spec", lambda name: None)
        pixels, labels = data._digits_table()
        assert pixels.dtype == raw.data.dtype and labels.dtype == raw.target.dtype, layout
        assert (pixels == raw.data).all() and (labels == raw.target).all(), layout


def test_digits_as_images(digits):
    images = data.digits(images=True)
    assert images.train_x.shape == (1438, 1, 8, 8), images.train_x.shape
    assert images.test_x.shape == (359, 1, 8, 8), images.test_x.shape
    assert torch.equal(images.train_x.reshape(1438, 64), digits.train_x), "same split, same pixels"
    assert torch.equal(images.train_y, digits.train_y)


def test_digits_split_follows_the_seed(digits):
    again = data.digits(seed=0)
    for a, b in zip(digits, again):
        assert torch.equal(a, b)
    other = data.digits(seed=1)
    assert other.train_x.shape == digits.train_x.shape
    assert not torch.equal(other.train_y, digits.train_y), "another seed, another split"


def test_digits_dtype():
    d64 = data.digits(dtype=torch.float64)
    assert d64.train_x.dtype == torch.float64 and d64.test_x.dtype == torch.float64
    assert d64.train_y.dtype == torch.int64


def test_synthetic():
    x, y = data.synthetic(20, 7, classes=3, seed=5)
    assert x.shape == (20, 7) and x.dtype == torch.float32
    assert y.shape == (20,) and y.dtype == torch.int64
    assert set(y.tolist()) <= {0, 1, 2}
    x2, y2 = data.synthetic(20, 7, classes=3, seed=5)
    assert torch.equal(x, x2) and torch.equal(y, y2)
    x3, _ = data.synthetic(20, 7, classes=3, seed=6)
    assert not torch.equal(x, x3)
    assert data.synthetic(4, 2, dtype=torch.float64)[0].dtype == torch.float64


def numbered(n):
    """x whose row i holds i, and y = i: easy to see which samples a batch holds."""
    return torch.arange(n, dtype=torch.float32).unsqueeze(1).repeat(1, 3), torch.arange(n)


def test_batches_shapes_and_drop_last():
    x, y = numbered(10)
    kept = list(data.batches(x, y, 4))
    assert [len(b[1]) for b in kept] == [4, 4], "drop_last drops the partial batch"
    assert kept[0][0].shape == (4, 3) and kept[0][1].shape == (4,)
    for bx, by in kept:
        assert torch.equal(bx[:, 0].long(), by), "x and y rows stay together"
    partial = list(data.batches(x, y, 4, drop_last=False))
    assert [len(b[1]) for b in partial] == [4, 4, 2]
    seen = torch.cat([b[1] for b in partial]).sort().values
    assert torch.equal(seen, torch.arange(10)), "every sample once per epoch"


def test_batches_in_order_without_shuffle():
    x, y = numbered(7)
    got = [b[1].tolist() for b in data.batches(x, y, 3, shuffle=False, drop_last=False)]
    assert got == [[0, 1, 2], [3, 4, 5], [6]], got


def test_batches_follow_the_seed():
    x, y = numbered(32)

    def order(seed):
        return [b[1].tolist() for b in data.batches(x, y, 8, seed=seed)]

    first = order(3)
    assert order(3) == first, "the same seed gives the same batches"
    assert order(4) != first, "another seed, another order"
    assert first != [list(range(i, i + 8)) for i in range(0, 32, 8)], "shuffled"


@pytest.mark.parametrize("kwargs, message", [
    (dict(n=10, ny=10, batch_size=0), "batch_size must be at least 1, got 0"),
    (dict(n=10, ny=9, batch_size=2), "x has 10 samples but y has 9"),
    (dict(n=10, ny=10, batch_size=11), "batch_size 11 is larger than the 10 samples"),
])
def test_batches_rejects_bad_arguments(kwargs, message):
    x, _ = numbered(kwargs["n"])
    _, y = numbered(kwargs["ny"])
    with pytest.raises(ValueError, match=message):
        data.batches(x, y, kwargs["batch_size"])


def test_a_batch_larger_than_the_data_is_fine_without_drop_last():
    x, y = numbered(5)
    got = [b[1].tolist() for b in data.batches(x, y, 8, shuffle=False, drop_last=False)]
    assert got == [[0, 1, 2, 3, 4]], got


def test_forever_goes_on_past_an_epoch_and_reshuffles():
    x, y = numbered(8)
    loader = data.batches(x, y, 4, seed=1)
    got = [b[1].tolist() for b in itertools.islice(data.forever(loader), 7)]
    assert len(got) == 7, "more batches than one epoch has"
    epochs = [got[0:2], got[2:4], got[4:6]]
    for epoch in epochs:
        assert sorted(epoch[0] + epoch[1]) == list(range(8)), epoch
    assert len({str(e) for e in epochs}) > 1, f"reshuffled each epoch: {epochs}"


def test_forever_rejects_a_loader_with_no_batches():
    loader = data.batches(torch.empty(0, 3), torch.empty(0, dtype=torch.int64), 4,
                          shuffle=False, drop_last=False)
    assert list(loader) == []
    with pytest.raises(ValueError, match="yields no batches"):
        next(data.forever(loader))


# --------------------------------------------------------------------------
# course.models
# --------------------------------------------------------------------------

def test_mlp_layers_and_output(digits):
    model = models.mlp()
    assert [name for name, _ in model.named_children()] == ["layer1", "layer2", "output"]
    assert model.layer1[0].in_features == 64 and model.layer1[0].out_features == 128
    assert isinstance(model.layer1[1], nn.ReLU)
    assert model.output.out_features == 10
    assert model(digits.train_x[:5]).shape == (5, 10)
    three = models.mlp(hidden=(16, 8, 4), classes=3, in_features=5)
    assert [name for name, _ in three.named_children()] == ["layer1", "layer2", "layer3", "output"]
    assert three(torch.zeros(2, 5)).shape == (2, 3)


def test_convnet_layers_and_output():
    images = data.digits(images=True)
    model = models.convnet()
    assert [name for name, _ in model.named_children()] == ["conv1", "conv2", "dense", "output"]
    assert isinstance(model.conv1[0], nn.Conv2d) and isinstance(model.conv2[-1], nn.MaxPool2d)
    assert model.dense[1].in_features == 32 * 4 * 4
    assert model(images.train_x[:5]).shape == (5, 10)
    wide = models.convnet(channels=(4, 6), dense=12, classes=5, image_size=12)
    assert wide(torch.zeros(3, 1, 12, 12)).shape == (3, 5)


@pytest.mark.parametrize("build", [models.mlp, models.convnet])
def test_the_same_seed_gives_the_same_parameters(build):
    a, b, c = build(seed=7), build(seed=7), build(seed=8)
    for (name, pa), pb, pc in zip(a.named_parameters(), b.parameters(), c.parameters()):
        assert torch.equal(pa, pb), name
        assert not torch.equal(pa, pc), name


@pytest.mark.parametrize("build", [models.mlp, models.convnet])
def test_seeding_leaves_the_global_random_state_alone(build):
    torch.manual_seed(1234)
    before = torch.get_rng_state()
    build(seed=3)
    assert torch.equal(torch.get_rng_state(), before), "building with a seed moved the global RNG"
    build(seed=None)
    assert not torch.equal(torch.get_rng_state(), before), "seed=None draws from the global RNG"


def test_seed_none_follows_the_global_seed():
    torch.manual_seed(99)
    a = models.mlp(seed=None)
    torch.manual_seed(99)
    b = models.mlp(seed=None)
    assert torch.equal(a.output.weight, b.output.weight)


@pytest.mark.parametrize("build", [models.mlp, models.convnet])
def test_model_dtype(build):
    model = build(dtype=torch.float64)
    assert {p.dtype for p in model.parameters()} == {torch.float64}
    assert {p.dtype for p in build().parameters()} == {torch.float32}


def test_bad_model_arguments():
    with pytest.raises(ValueError, match="at least one layer"):
        models.mlp(hidden=())
    with pytest.raises(ValueError, match="image_size must be even"):
        models.convnet(image_size=7)


class Recording(nn.Module):
    """Predicts class x[:, 0] (as one-hot logits) and notes the mode it ran in."""

    def __init__(self, classes=10):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(()))
        self.classes = classes
        self.modes = []

    def forward(self, x):
        self.modes.append(self.training)
        return nn.functional.one_hot(x[:, 0].long(), self.classes).float() * self.scale


def test_accuracy_of_a_perfect_and_a_half_wrong_model():
    y = torch.arange(25) % 10
    model = Recording()
    assert models.accuracy(model, y.unsqueeze(1).float(), y, batch_size=4) == 1.0
    assert len(model.modes) == 7, "25 samples in batches of 4"
    wrong = y.clone()
    wrong[::2] = (wrong[::2] + 1) % 10   # 13 of 25 labels no longer match
    assert models.accuracy(model, y.unsqueeze(1).float(), wrong) == pytest.approx(12 / 25)


def test_accuracy_of_a_hand_set_linear_layer():
    linear = nn.Linear(10, 10)
    with torch.no_grad():
        linear.weight.copy_(torch.eye(10))
        linear.bias.zero_()
    y = torch.tensor([3, 1, 4, 1, 5, 9, 2, 6])
    x = nn.functional.one_hot(y, 10).float()
    assert models.accuracy(linear, x, y) == 1.0
    assert models.accuracy(linear, x, (y + 1) % 10) == 0.0


@pytest.mark.parametrize("training", [True, False])
def test_accuracy_runs_in_eval_mode_and_restores_the_mode(training):
    model = Recording()
    model.train(training)
    y = torch.arange(5)
    models.accuracy(model, y.unsqueeze(1).float(), y)
    assert model.modes == [False], model.modes
    assert model.training is training


def test_accuracy_restores_the_mode_after_an_error():
    model = Recording()
    model.train()
    with pytest.raises(RuntimeError):
        models.accuracy(model, torch.tensor([[12.0]]), torch.tensor([0]))  # class 12 of 10
    assert model.training is True


def test_accuracy_does_not_track_gradients():
    model = models.mlp(in_features=4, hidden=(3,), classes=2)
    models.accuracy(model, torch.randn(6, 4), torch.zeros(6, dtype=torch.int64))
    assert all(p.grad is None for p in model.parameters())


# --------------------------------------------------------------------------
# course.throughput.sweep
# --------------------------------------------------------------------------

COLUMNS = ["batch_size", "ms_per_step", "samples_per_s", "samples_per_s_min", "samples_per_s_max"]


class FakeSteps:
    """make_step for sweep: each step returns the next duration from durations(batch_size)."""

    def __init__(self, durations):
        self.durations = durations
        self.made = []
        self.calls = {}

    def __call__(self, batch_size):
        self.made.append(batch_size)
        self.calls[batch_size] = 0
        times = iter(self.durations(batch_size))

        def step():
            self.calls[batch_size] += 1
            return next(times)
        return step


def test_sweep_reports_the_median_and_the_spread():
    # Warm-up steps are 100 s: counted, they would change every column.
    fake = FakeSteps(lambda b: [100.0, 100.0, 0.010, 0.001, 0.002, 0.003])
    frame = throughput.sweep(fake, [32, 64], steps=4, warmup=2, progress=False)
    assert list(frame.columns) == COLUMNS, list(frame.columns)
    assert frame.batch_size.tolist() == [32, 64]
    for _, row in frame.iterrows():
        b = row.batch_size
        assert row.ms_per_step == pytest.approx(2.5), "median of 1, 2, 3, 10 ms (not the mean)"
        assert row.samples_per_s == pytest.approx(b / 0.0025)
        assert row.samples_per_s_min == pytest.approx(b / 0.010), "slowest step"
        assert row.samples_per_s_max == pytest.approx(b / 0.001), "fastest step"
    assert fake.made == [32, 64], "one make_step per batch size, in order"
    assert fake.calls == {32: 6, 64: 6}, "warmup + steps calls each"


def test_sweep_with_a_step_time_linear_in_the_batch():
    fake = FakeSteps(lambda b: itertools.repeat(0.001 + b * 1e-5))
    frame = throughput.sweep(fake, [16, 48, 256], steps=3, warmup=0, progress=False)
    expected_ms = [1e3 * (0.001 + b * 1e-5) for b in (16, 48, 256)]
    assert frame.ms_per_step.tolist() == pytest.approx(expected_ms)
    assert frame.samples_per_s.tolist() == pytest.approx([b / (0.001 + b * 1e-5) for b in (16, 48, 256)])
    assert (frame.samples_per_s_min == frame.samples_per_s_max).all(), "every step the same"
    assert fake.calls == {16: 3, 48: 3, 256: 3}


def test_sweep_median_of_an_odd_count():
    fake = FakeSteps(lambda b: [0.005, 0.001, 0.030])
    frame = throughput.sweep(fake, [10], steps=3, warmup=0, progress=False)
    assert frame.ms_per_step[0] == pytest.approx(5.0)
    assert frame.samples_per_s[0] == pytest.approx(2000.0)


@pytest.mark.parametrize("batch_sizes, steps, warmup", [
    ([], 4, 1), ([0, 32], 4, 1), ([-8], 4, 1), ([16.5], 4, 1),
    ([16], 0, 1), ([16], 4, -1),
])
def test_sweep_rejects_bad_arguments(batch_sizes, steps, warmup):
    fake = FakeSteps(lambda b: itertools.repeat(0.001))
    with pytest.raises(ValueError):
        throughput.sweep(fake, batch_sizes, steps=steps, warmup=warmup, progress=False)
    assert fake.made == [], "nothing runs before the arguments are checked"


@pytest.mark.parametrize("duration", [0.0, -0.001])
def test_sweep_rejects_a_step_that_does_not_return_its_duration(duration):
    fake = FakeSteps(lambda b: [0.001, duration, 0.001])
    with pytest.raises(ValueError, match="must return the step's duration in seconds"):
        throughput.sweep(fake, [8], steps=3, warmup=0, progress=False)


# --------------------------------------------------------------------------
# course.throughput.lesson
# --------------------------------------------------------------------------

def curve(points):
    """A sweep-shaped frame from {batch_size: samples_per_s}, in a jumbled order."""
    rows = [{"batch_size": b, "ms_per_step": 1e3 * b / s, "samples_per_s": s,
             "samples_per_s_min": 0.9 * s, "samples_per_s_max": 1.1 * s} for b, s in points.items()]
    return pd.DataFrame(rows[::-1])


# 48 sits far under the line from 32 (1600) to 64 (4000): 1200 / 2800 - 1 = -57 %.
# 80 sits over the line from 64 (4000) to 96 (7400): 7000 / 5700 - 1 = +23 %.
CURVE = {16: 800.0, 32: 1600.0, 48: 1200.0, 64: 4000.0, 80: 7000.0, 96: 7400.0, 128: 8000.0}


def test_lesson_says_what_the_curve_shows():
    text = throughput.lesson(curve(CURVE), "cuda:0")
    lines = text.splitlines()
    assert lines[0] == "On cuda:0, the best throughput is 8,000 samples/s, at batch size 128.", lines[0]
    assert ("Batches under 64 reach 10% to 20% of that: 80% or more of what the device "
            "could do is wasted.") in lines, text
    assert "At 64, throughput is 50% of the best." in lines, text
    assert "Batch 48 (not a multiple of 32) is 57% below the line between 32 and 64." in lines, text
    assert "Batch 80 (not a multiple of 32) is 23% above the line between 64 and 96." in lines, text
    assert ("So on cuda:0, batch 48, off the multiples of 32, is slower than its neighbours (more than 10% below the "
            "line between them, fastest step included): this curve shows the slowdown the sources' tile rule "
            "predicts.") in lines, text
    assert lines[-1] == "The curve is within 10% of its best from batch size 96 on.", lines[-1]
    assert "Batch 16 " not in text, "16 has no multiple of 32 below it to draw a line from"


SHOWS = ("So on cpu, batch 48, off the multiples of 32, is slower than its neighbours (more than 10% below the line "
         "between them, fastest step included): this curve shows the slowdown the sources' tile rule predicts.")
DOES_NOT = ("So on cpu, no batch off the multiples of 32 is slower than its neighbours (more than 10% below the line "
            "between them, fastest step included): this curve does not show the sources' tile rule.")


def test_lesson_says_whether_the_curve_shows_the_tile_rule():
    # 48: 1900 against the line 1600..4000 at its middle, 2800: 32 % below, its fastest step (2090) too.
    # 80: 5400 against 5700: 5 % below, within the tolerance. 112 against 7400..8000 at 7700: 4 % above.
    text = throughput.lesson(curve({32: 1600.0, 48: 1900.0, 64: 4000.0, 80: 5400.0, 96: 7400.0,
                                    112: 8000.0, 128: 8000.0}), "cpu")
    assert SHOWS in text.splitlines(), text
    text = throughput.lesson(curve({32: 1600.0, 48: 2700.0, 64: 4000.0, 80: 5400.0, 96: 7400.0}), "cpu")
    assert "Batch 48 (not a multiple of 32) is 4% below the line between 32 and 64." in text.splitlines(), text
    assert "Batch 80 (not a multiple of 32) is 5% below the line between 64 and 96." in text.splitlines(), text
    assert DOES_NOT in text.splitlines(), text
    text = throughput.lesson(curve({32: 1000.0, 48: 500.0, 64: 4000.0, 80: 2000.0, 96: 5000.0}), "cpu")
    assert ("So on cpu, batches 48 and 80, off the multiples of 32, are slower than their neighbours (more than 10% "
            "below the line between them, fastest step included): this curve shows the slowdown the sources' tile "
            "rule predicts.") in text.splitlines(), text


def test_lesson_takes_a_noisy_median_for_noise_not_for_the_tile_rule():
    # 48's median is 29 % under the line (2000 against 2800), but its fastest step, 3000, is over it.
    frame = curve({32: 1600.0, 48: 2000.0, 64: 4000.0})
    frame.loc[frame.batch_size == 48, "samples_per_s_max"] = 3000.0
    text = throughput.lesson(frame, "cpu")
    assert "Batch 48 (not a multiple of 32) is 29% below the line between 32 and 64." in text.splitlines(), text
    assert DOES_NOT in text.splitlines(), text


def test_lesson_knee_is_the_smallest_batch_within_ten_percent():
    # 64 reaches 91 % of the best, 96 dips to 85 %: the knee is still 64.
    text = throughput.lesson(curve({32: 500.0, 64: 910.0, 96: 850.0, 128: 1000.0}), "cpu")
    assert text.splitlines()[-1] == "The curve is within 10% of its best from batch size 64 on.", text
    assert text.startswith("On cpu, the best throughput is 1,000 samples/s, at batch size 128."), text


def test_lesson_leaves_out_what_was_not_measured():
    text = throughput.lesson(curve({128: 900.0, 256: 1000.0, 512: 950.0}), "cpu")
    assert "Batches under" not in text and "At 64" not in text and "not a multiple" not in text, text
    assert "tile rule" not in text, "no verdict on the rule without a batch off the grid to judge it by"
    assert text.splitlines() == [
        "On cpu, the best throughput is 1,000 samples/s, at batch size 256.",
        "The curve is within 10% of its best from batch size 128 on.",
    ], text


def test_lesson_on_a_sweep_frame():
    fake = FakeSteps(lambda b: itertools.repeat(0.001 + b * 1e-5))
    frame = throughput.sweep(fake, [16, 32, 64, 128], steps=2, warmup=0, progress=False)
    text = throughput.lesson(frame, "cpu")
    best = 128 / (0.001 + 128 * 1e-5)
    assert text.splitlines()[0] == f"On cpu, the best throughput is {best:,.0f} samples/s, at batch size 128.", text


# --------------------------------------------------------------------------
# course.plots
# --------------------------------------------------------------------------

STEPS = {
    "batch 32": {"read": 0.001, "forward layer1": 0.002, "backward": 0.003},
    "batch 256": {"read": 0.004, "forward layer1": 0.005, "loss": 0.0005, "backward": 0.006,
                  "optimizer": 0.001},
}


def stack_tops(ax):
    return [rect.get_y() + rect.get_height() for rect in ax.containers[-1]]


def test_phase_bars_stack_the_phases_of_each_step(ax):
    plots.phase_bars(ax, STEPS)
    names = [c.get_label() for c in ax.containers]
    assert names == ["read", "forward layer1", "backward", "loss", "optimizer"], "first-seen order"
    assert [len(c) for c in ax.containers] == [2] * 5, "one rectangle per step in every container"
    assert stack_tops(ax) == pytest.approx([6.0, 16.5]), "step totals in ms"
    assert [t.get_text() for t in ax.xaxis.get_ticklabels()] == ["batch 32", "batch 256"]
    assert ax.get_ylabel() == "time per step (ms)"
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend == names[::-1], "the legend reads top to bottom like the stack"


def test_phase_bars_a_missing_phase_adds_nothing(ax):
    plots.phase_bars(ax, STEPS, legend=False)
    loss = ax.containers[names_index(ax, "loss")]
    assert [r.get_height() for r in loss] == pytest.approx([0.0, 0.5])
    # Each phase starts where the phases under it end.
    backward = ax.containers[names_index(ax, "backward")]
    assert [r.get_y() for r in backward] == pytest.approx([3.0, 9.0])
    assert ax.get_legend() is None


def names_index(ax, name):
    return [c.get_label() for c in ax.containers].index(name)


@pytest.mark.parametrize("unit, scale", [("s", 1.0), ("ms", 1e3), ("us", 1e6)])
def test_phase_bars_units(ax, unit, scale):
    plots.phase_bars(ax, STEPS, unit=unit, title="two steps")
    assert stack_tops(ax) == pytest.approx([0.006 * scale, 0.0165 * scale])
    assert ax.get_ylabel() == f"time per step ({unit})"
    assert ax.get_title() == "two steps"


def test_phase_bars_rejects_an_unknown_unit(ax):
    with pytest.raises(ValueError, match="unit must be one of"):
        plots.phase_bars(ax, STEPS, unit="minutes")


def test_phase_colours_group_the_phases():
    phases = ["read", "to device", "forward layer1", "forward layer2", "forward output", "loss",
              "backward output", "backward layer1", "optimizer", "weight update", "all_reduce",
              "comm wait", "something else"]
    colours = plots.phase_colours(phases)
    assert set(colours) == set(phases), "every phase has a colour"
    for colour in colours.values():
        assert len(colour) == 4 and all(0 <= c <= 1 for c in colour), colour
    forward = [colours[p] for p in phases if p.startswith("forward")]
    assert len(set(forward)) == 3, "shades within a group are distinct"
    for r, g, b, _ in forward:
        assert b > r and b > g, "forward phases are blue"
    for p in ("backward output", "backward layer1"):
        r, g, b, _ = colours[p]
        assert r > g > b, f"{p} is orange"
    for p in ("optimizer", "weight update"):
        r, g, b, _ = colours[p]
        assert g > r and g > b, f"{p} is green"
    for p in ("all_reduce", "comm wait"):
        r, g, b, _ = colours[p]
        assert r > g and r > b, f"{p} is red"
    for p in ("read", "to device", "something else"):
        r, g, b, _ = colours[p]
        assert r == g == b, f"{p} is grey"
    r, g, b, _ = colours["loss"]
    assert b > g and r > g, "loss is purple"


def test_phase_colours_are_stable_for_the_same_groups():
    one = plots.phase_colours(["forward a", "backward a"])
    assert one["forward a"] == plots.phase_colours(["forward a", "loss", "backward a"])["forward a"]
    assert one["forward a"] != one["backward a"]



def test_projector_sets_large_type_and_thick_lines_and_gives_the_old_values_back():
    import matplotlib as mpl

    before = {name: mpl.rcParams[name] for name in plots.PROJECTOR}
    assert mpl.rcParams["font.size"] < 16
    with plots.projector({"lines.linewidth": 5.0}) as settings:
        assert mpl.rcParams["font.size"] >= 16 and mpl.rcParams["axes.titlesize"] >= 16
        assert mpl.rcParams["lines.linewidth"] == 5.0, "rc overrides PROJECTOR"
        assert tuple(mpl.rcParams["figure.figsize"]) == plots.PROJECTOR["figure.figsize"]
        assert mpl.rcParams["figure.dpi"] > before["figure.dpi"]
        fig = plt.figure()
        assert tuple(fig.get_size_inches()) == plots.PROJECTOR["figure.figsize"], "new figures are projector-sized"
        plt.close(fig)
        assert settings.saved == before
    assert {name: mpl.rcParams[name] for name in plots.PROJECTOR} == before
    with pytest.raises(KeyError):
        plots.projector({"no.such.setting": 1})
    assert {name: mpl.rcParams[name] for name in plots.PROJECTOR} == before, "nothing set when a name is wrong"


def test_projector_called_on_its_own_stays_set():
    import matplotlib as mpl

    before = {name: mpl.rcParams[name] for name in plots.PROJECTOR}
    try:
        plots.projector()
        assert mpl.rcParams["font.size"] == plots.PROJECTOR["font.size"]
    finally:
        mpl.rcParams.update(before)

def test_overlapping_text_names_texts_drawn_over_each_other_and_only_those():
    fig, (left, right) = plt.subplots(1, 2, figsize=(8, 3))
    try:
        left.text(0.5, 0.5, "first label")
        left.text(0.52, 0.5, "second label")          # a few pixels to the right: over the first
        left.text(0.1, 0.1, "alone")
        left.text(0.5, 0.5, "hidden", visible=False)  # not drawn, not counted
        left.text(0.5, 0.5, "  ")                     # nothing to read
        left.set_xticks([0, 5, 10, 500], ["0", "5", "10", "beyond the limits"])
        left.set_xlim(0, 10)                          # the last tick is beyond it: not drawn
        # turned 60 degrees, side by side: their upright boxes overlap, their letters do not
        turned = [right.text(x, 0.5, "turned text", rotation=60, transform=right.transAxes, ha="center",
                             va="center") for x in (0.2, 0.28, 0.36)]
        assert plots.overlapping_text(fig) == ["'first label' over 'second label'"]
        renderer = fig.canvas.get_renderer()
        assert turned[0].get_window_extent(renderer).overlaps(turned[1].get_window_extent(renderer))
        right.text(0.28, 0.5, "crossing", transform=right.transAxes, ha="center", va="center")
        crossed = ["'turned text' over 'crossing'"] * 3     # across all three
        assert plots.overlapping_text(fig) == ["'first label' over 'second label'", *crossed]
    finally:
        plt.close(fig)


def test_overlapping_text_allows_boxes_that_touch_within_the_slack():
    fig, ax = plt.subplots(figsize=(4, 2))
    try:
        renderer = fig.canvas.get_renderer()
        one = ax.text(0.1, 0.5, "one", transform=ax.transAxes)
        box = one.get_window_extent(renderer)
        # the next text starts half a pixel inside the first's box: within the 1-pixel slack
        ax.annotate("two", (box.x1 - 0.5, box.y0), xycoords="figure pixels")
        assert plots.overlapping_text(fig) == []
        assert plots.overlapping_text(fig, slack_px=0.0) == ["'one' over 'two'"]
    finally:
        plt.close(fig)


def test_throughput_curve_on_a_sweep(ax):
    fake = FakeSteps(lambda b: itertools.repeat(0.001 + b * 1e-5))
    frame = throughput.sweep(fake, [128, 16, 48, 32, 64], steps=2, warmup=0, progress=False)
    plots.throughput_curve(ax, frame, title="cpu")
    assert ax.get_xscale() == "log"
    assert ax.xaxis.get_transform().base == 2
    assert ax.get_ylim()[0] == 0
    assert ax.get_title() == "cpu"
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend == ["min-max over steps", "multiple of 32", "not a multiple of 32"], legend
    line = ax.get_lines()[0]
    assert list(line.get_xdata()) == [16, 32, 48, 64, 128], "sorted by batch size"
    assert list(line.get_ydata()) == pytest.approx(frame.sort_values("batch_size").samples_per_s.tolist())
    by_label = {ln.get_label(): ln for ln in ax.get_lines()}
    assert list(by_label["multiple of 32"].get_xdata()) == [32, 64, 128]
    assert list(by_label["not a multiple of 32"].get_xdata()) == [16, 48]
    assert by_label["not a multiple of 32"].get_markerfacecolor() == "white", "hollow markers"
    assert list(ax.get_lines()[-1].get_xdata()) == [64, 64], "the dotted line at 64"


def test_throughput_curve_without_off_grid_batches(ax):
    fake = FakeSteps(lambda b: itertools.repeat(0.001 + b * 1e-5))
    frame = throughput.sweep(fake, [32, 64, 128], steps=1, warmup=0, progress=False)
    plots.throughput_curve(ax, frame)
    labels = [ln.get_label() for ln in ax.get_lines()]
    assert "not a multiple of 32" not in labels, labels
    assert ax.get_xscale() == "log"


def test_sweep_takes_numpy_batch_sizes():
    import numpy as np

    frame = throughput.sweep(lambda b: (lambda: 0.001 * b), 2 ** np.arange(3, 6), steps=1, warmup=0,
                             progress=False)
    assert frame["batch_size"].tolist() == [8, 16, 32]


def test_mfu_curve_draws_the_utilisation_in_percent(ax):
    frame = pd.DataFrame({"batch_size": [64, 8, 1024], "samples_per_s": [1.0, 1.0, 1.0],
                          "mfu": [0.05, 0.01, 0.4]})
    plots.mfu_curve(ax, frame, title="cpu", peak_label="the fp32 peak")
    line = ax.get_lines()[0]
    assert list(line.get_xdata()) == [8, 64, 1024], "sorted by batch size"
    assert list(line.get_ydata()) == pytest.approx([1.0, 5.0, 40.0]), "percent of the peak"
    assert line.get_label() == "MFU against the fp32 peak"
    assert ax.get_xscale() == "log" and ax.get_ylim()[0] == 0 and ax.get_title() == "cpu"
    assert list(ax.get_lines()[-1].get_xdata()) == [64, 64], "the dotted line at 64"


def test_mfu_curve_draws_both_ratios_of_a_utilisation_frame(ax):
    frame = mfu.with_utilisation(pd.DataFrame({"batch_size": [16, 8], "samples_per_s": [100.0, 50.0]}), 1e6,
                                 datasheet_peak=1e9, measured_peak=5e8)
    plots.mfu_curve(ax, frame, peak_label="the fp32 datasheet peak", measured_label="of the measured fp32 peak")
    solid, dashed = ax.get_lines()[:2]
    assert solid.get_label() == "MFU against the fp32 datasheet peak" and solid.get_linestyle() == "-"
    assert list(solid.get_ydata()) == pytest.approx([5.0, 10.0])
    assert dashed.get_label() == "of the measured fp32 peak" and dashed.get_linestyle() == "--"
    assert list(dashed.get_ydata()) == pytest.approx([10.0, 20.0]), "the measured peak is the lower one"


def test_mfu_curve_refuses_a_frame_without_mfu(ax):
    with pytest.raises(ValueError, match="course.mfu.with_mfu"):
        plots.mfu_curve(ax, pd.DataFrame({"batch_size": [8], "samples_per_s": [1.0]}))


def test_overlapping_text_reads_a_closed_figure_as_it_was_shown():
    # a view closes its figure before displaying it (course.widgets): its canvas can no longer draw
    fig, ax = plt.subplots(figsize=(4, 2))
    ax.text(0.5, 0.5, "one")
    ax.text(0.5, 0.5, "two")
    plt.close(fig)
    closed = fig.canvas
    assert not hasattr(closed, "get_renderer")
    assert plots.overlapping_text(fig) == ["'one' over 'two'"]
    assert fig.canvas is closed, "the figure keeps its canvas"


@pytest.mark.parametrize("inches", [12.0, 17.0])
def test_projector_shows_a_figure_drawn_at_the_output_areas_width_whatever_its_size(inches):
    import struct

    fig = plt.figure(figsize=(inches, 4))
    try:
        png = legible._png_at_width(legible.PROJECTOR_WIDTH_PX)(fig)
    finally:
        plt.close(fig)
    assert struct.unpack(">I", png[16:20])[0] == legible.PROJECTOR_WIDTH_PX


def test_a_figures_legend_over_a_panel_is_named_and_one_beside_the_panels_is_not():
    fig, ax = plt.subplots(figsize=(6, 3), layout="constrained")
    ax.bar([0, 1], [1, 2], label="bars")
    ax.set_title("sent")
    try:
        beside = fig.legend(loc="outside lower center")
        assert plots.legends_over_axes(fig) == []
        beside.remove()
        fig.legend(loc="center")
        assert plots.legends_over_axes(fig) == ["legend over panel 'sent'"]
    finally:
        plt.close(fig)

"""Pipeline schedules on a stage × time grid, predicted and measured, and the bytes a pipeline sends.

    schedule_view.show(measured={"schedule": "1f1b", "stages": 4, "micro_batches": 8,
                                 "spans": results.timeline})                 # in a notebook
    fig = schedule_view.draw(schedule="gpipe", stages=4, micro_batches=8)   # the figure alone

Top: the grid `course.pipeline.grid` predicts, one row per stage, a box per forward (blues)
and backward (oranges), each labelled with its micro-batch; white is idle, the bubble. Its
time unit is one micro-batch's forward on one stage; equal stages and free sends are assumed
(`course.pipeline`'s docstring). Below it, given a run's spans: the same grid measured, in ms
(`measured_grid`). Right: the bytes one rank sends per step for the same model (the labs' MLP,
64 -> 64 × (layers-1) -> 10, cut into whole layers) and batch, on as many ranks as stages: the
pipeline's busiest stage (a middle one sends activations forward and gradients back), data
parallelism's ring all-reduce of the gradients (`course.sizes.data_parallel_total`), and lab 3's
split weights, column-then-row blocks over the whole model (`course.memory.sent_per_step`).

Used in: lab 6 (06_pipeline_parallel), the demo (solutions/demo.ipynb).
"""
from __future__ import annotations

import re
from collections.abc import Mapping

import matplotlib.pyplot as plt

from course import memory, pipeline, sizes
from course.memory_view import in_units, unit_of
from course.pipeline import Slot
from course.plots import phase_colours
from course.widgets import STYLE, int_slider, show_view

SCHEMES = ("pipeline", "data parallel", "split weights")
COLOURS = {"pipeline": "#3182bd", "data parallel": "#636363", "split weights": "#756bb1"}
#: what a measured grid belongs to: shown only while the controls are the run's
RUN_SETTINGS = ("schedule", "stages", "micro_batches")
SPAN_NAME = re.compile(r"^(forward|backward) (\d+)$")
#: a box narrower than this share of the grid's time gets no number (it would not fit)
NARROWEST_LABELLED = 1 / 50


def model_layers(layers: int = 8, width: int = 64, *, inputs: int = 64, classes: int = 10) -> list[sizes.Dense]:
    """The labs' MLP (`course.models.mlp(inputs, (width,) * (layers-1), classes)`) as `layers` Dense layers."""
    if isinstance(layers, bool) or not isinstance(layers, int) or layers < 1:
        raise ValueError(f"layers must be a whole number of at least 1, got layers={layers!r}")
    widths = [inputs, *[width] * (layers - 1), classes]
    return [sizes.Dense(f"layer{i + 1}", a, b) for i, (a, b) in enumerate(zip(widths, widths[1:]))]


def sent(stages: int, *, batch: int, width: int, layers: int, dtype: str) -> dict[str, float | str]:
    """scheme -> bytes one rank sends per step on `stages` ranks, or why the scheme cannot run there."""
    model = model_layers(layers, width)
    counts: dict[str, float | str] = {}
    counts["pipeline"] = (pipeline.busiest_sent_per_step(stages, batch=batch, width=width, dtype=dtype)
                          if stages <= layers else f"{layers} layers make at most {layers} stages")
    counts["data parallel"] = sizes.data_parallel_total(model, stages, dtype)
    parameters = sum(layer.weights for layer in model)
    try:
        counts["split weights"] = memory.sent_per_step(parameters, stages, "split weights", dtype=dtype,
                                                       layers=model, batch=batch)
    except ValueError:      # the features do not divide over the ranks
        counts["split weights"] = f"{width} features do not split over {stages} ranks"
    return counts


def _field(span, name: str):
    return span[name] if isinstance(span, Mapping) else getattr(span, name)


def measured_grid(spans, ranks: int | None = None, *, step: str = "step") -> list[Slot]:
    """A run's spans as the grid's Slots (times in seconds), so that a measured grid draws as a predicted one.

    spans: objects or dicts with rank, name, start and end (`course.timeline.Span`, a run's
    `results.timeline`); those named "forward i" and "backward i" (i the micro-batch) become
    slots, the others are ignored. Times count from each rank's span named `step` where every
    rank has one (its step's start, after the barrier that lines the ranks up), else from the
    earliest forward or backward of all ranks, which reads the ranks' clocks as one (each counts
    from its own function's start: off by as much as the ranks started apart). ranks: the number
    of stages (None: one more than the highest rank seen). A run of several steps: each micro-batch's
    latest forward and backward (the first step's are slowed by warming up)."""
    spans = list(spans)
    latest: dict[tuple[int, str, int], tuple[float, float]] = {}     # a span timed again: a later step's
    for span in spans:
        match = SPAN_NAME.match(str(_field(span, "name")))
        if match:
            key = (int(_field(span, "rank")), "F" if match[1] == "forward" else "B", int(match[2]))
            start, end = float(_field(span, "start")), float(_field(span, "end"))
            if key not in latest or start > latest[key][0]:
                latest[key] = (start, end)
    found = [(*key, start, end) for key, (start, end) in latest.items()]
    if not found:
        raise ValueError(f"none of the {len(spans)} spans is named 'forward i' or 'backward i' (i the micro-batch): "
                         "time each stage's forward and backward of micro-batch i under those names "
                         "(course.timeline.span(f'forward {i}'), or the lab kit's timed steps)")
    rows = max(rank for rank, *_ in found) + 1 if ranks is None else ranks
    if any(rank >= rows for rank, *_ in found):
        raise ValueError(f"a span of rank {max(rank for rank, *_ in found)} lies outside ranks={rows}: "
                         f"pass the run's number of stages, or ranks=None")
    steps: dict[int, float] = {}
    for span in (s for s in spans if _field(s, "name") == step):
        rank = int(_field(span, "rank"))
        steps[rank] = max(steps.get(rank, float("-inf")), float(_field(span, "start")))
    ranks_seen = {rank for rank, *_ in found}
    earliest = min(start for *_, start, _ in found)
    origin = {rank: steps[rank] if ranks_seen <= set(steps) else earliest for rank in ranks_seen}
    slots = [Slot(rank, action, i, start - origin[rank], end - origin[rank]) for rank, action, i, start, end in found]
    return sorted(slots, key=lambda slot: (slot.stage, slot.start))


def draw_grid(ax, slots, stages: int, *, scale: float = 1.0) -> None:
    """Boxes of `slots` on ax, one row per stage (stage 0 on top), times multiplied by `scale`."""
    slots = list(slots)
    forwards = sorted({s.micro_batch for s in slots if s.action == "F"})
    backwards = sorted({s.micro_batch for s in slots if s.action == "B"})
    colours = phase_colours([f"forward {i}" for i in forwards] + [f"backward {i}" for i in backwards])
    length = (max(s.end for s in slots) - min(s.start for s in slots)) * scale
    for slot in slots:
        name = f"{'forward' if slot.action == 'F' else 'backward'} {slot.micro_batch}"
        start, width = slot.start * scale, (slot.end - slot.start) * scale
        ax.barh(slot.stage, width, left=start, height=0.8, color=colours[name], edgecolor="white", linewidth=0.5)
        if width >= NARROWEST_LABELLED * length:
            ax.text(start + width / 2, slot.stage, str(slot.micro_batch), ha="center", va="center",
                    fontsize="x-small", color="white" if slot.action == "F" else "black")
    ax.set_yticks(range(stages), [f"stage {s}" for s in range(stages)])
    ax.set_ylim(stages - 0.5, -0.5)                      # stage 0 on top, as the classic picture
    ax.set_xlim(left=min(0.0, min(s.start for s in slots) * scale))
    ax.set_facecolor("white")


def _slots(measured, stages: int) -> list[Slot]:
    measured = list(measured)
    return measured if measured and all(isinstance(s, Slot) for s in measured) else measured_grid(measured, stages)


def draw(*, schedule: str = "1f1b", stages: int = 4, micro_batches: int = 8, forward: float = 1.0,
         backward: float = 2.0, measured=None, batch: int = 64, width: int = 64, layers: int = 8,
         dtype: str = "float32"):
    """The view as a matplotlib Figure (see the module docstring).

    forward, backward: one micro-batch's seconds on one stage (only their ratio shows: the grid's
    unit is a forward); measured: a run's spans (or Slots) at these settings, drawn beneath;
    batch, width, layers, dtype: the model and batch whose bytes per step the bars count."""
    slots = pipeline.grid(schedule, stages, micro_batches, forward=forward, backward=backward)
    formula = pipeline.bubble_fraction(stages, micro_batches)
    measured_slots = _slots(measured, stages) if measured is not None else None
    rows = 2 if measured_slots else 1
    fig = plt.figure(figsize=(15, 3.2 + 0.25 * stages) if rows == 1 else (15, 5 + 0.5 * stages),
                     layout="constrained")
    panels = fig.add_gridspec(rows, 2, width_ratios=(3.2, 1))
    grid_ax = fig.add_subplot(panels[0, 0])
    draw_grid(grid_ax, slots, stages, scale=1 / forward)
    grid_ax.set_xlabel("time, in forwards of one micro-batch on one stage")
    grid_ax.set_title(f"predicted, {schedule}: bubble {pipeline.grid_bubble(slots):.1%} of the grid, "
                      f"(N−1)/(m+N−1) = {formula:.1%}", fontsize="medium")
    if measured_slots:
        run_ax = fig.add_subplot(panels[1, 0])
        draw_grid(run_ax, measured_slots, stages, scale=1e3)
        run_ax.set_xlabel("time since the step started (ms)")
        step_ms = max(s.end for s in measured_slots) * 1e3
        run_ax.set_title(f"measured: bubble {pipeline.grid_bubble(measured_slots, stages):.1%}, "
                         f"step {step_ms:.3g} ms", fontsize="medium")

    bar_ax = fig.add_subplot(panels[:, 1])
    sends = sent(stages, batch=batch, width=width, layers=layers, dtype=dtype)
    counted = {scheme: b for scheme, b in sends.items() if not isinstance(b, str)}
    size, unit = unit_of(max([*counted.values(), 1]))
    bar_ax.bar([SCHEMES.index(s) for s in counted], [b / size for b in counted.values()],
               color=[COLOURS[s] for s in counted])
    bar_ax.set_xticks(range(len(SCHEMES)), ["pipeline\n(busiest stage)", "data parallel", "split weights"])
    missing = [f"{scheme}: {b}" for scheme, b in sends.items() if isinstance(b, str)]
    for scheme, b in counted.items():
        bar_ax.text(SCHEMES.index(scheme), b / size, in_units(b), ha="center", va="bottom", fontsize="small")
    if missing:         # said in words, in the panel's corner: no bar to hang it on
        bar_ax.text(0.98, 0.98, "\n".join(missing), transform=bar_ax.transAxes, ha="right", va="top",
                    fontsize="small", wrap=True)
    bar_ax.set_ylabel(f"{unit} sent per rank per step")
    bar_ax.set_title(f"{layers}-layer MLP, batch {batch}, {stages} ranks", fontsize="medium")
    bar_ax.margins(y=0.35 if missing else 0.2)
    fig.suptitle(f"{schedule}: {stages} stages, {micro_batches} micro-batches, backward = {backward / forward:.3g} "
                 f"forwards", fontsize="medium")
    return fig


def describe(*, schedule: str = "1f1b", stages: int = 4, micro_batches: int = 8, forward: float = 1.0,
             backward: float = 2.0, batch: int = 64, width: int = 64, layers: int = 8,
             dtype: str = "float32") -> str:
    """The figure's numbers in a line of markdown."""
    slots = pipeline.grid(schedule, stages, micro_batches, forward=forward, backward=backward)
    step = max(slot.end for slot in slots) / forward
    peaks = {s: pipeline.peak_micro_batches(s, 0, stages, micro_batches) for s in pipeline.SCHEDULES}
    others = "; ".join(f"{s} {peaks[s]}" for s in pipeline.SCHEDULES if s != schedule)
    sends = sent(stages, batch=batch, width=width, layers=layers, dtype=dtype)
    words = "; ".join(f"{scheme} {b if isinstance(b, str) else in_units(b)}" for scheme, b in sends.items())
    return (f"**{schedule}, {stages} stages, {micro_batches} micro-batches:** bubble "
            f"{pipeline.grid_bubble(slots):.1%} of the grid, (N−1)/(m+N−1) = "
            f"{pipeline.bubble_fraction(stages, micro_batches):.1%}; a step takes {step:.3g} forwards "
            f"(a backward {backward / forward:.3g} forwards). Stage 0 keeps at most {peaks[schedule]} "
            f"micro-batches' activations ({others}). Bytes per rank per step, {layers}-layer MLP, batch {batch}, "
            f"{dtype}: {words}.")


def show(measured: Mapping | None = None, **start):
    """The view with a menu and sliders (a static figure under grading or headless).

    measured: one run, {"schedule", "stages", "micro_batches", "spans"} (its spans: a run's
    `results.timeline`, see `measured_grid`); the controls start at its settings, and its grid
    shows while schedule, stages and micro-batches are the run's. start: starting values for
    the controls (schedule, stages, micro_batches) and fixed settings passed to draw
    (forward, backward, batch, width, layers, dtype)."""
    import ipywidgets as w

    run = {}
    if measured is not None:
        if not isinstance(measured, Mapping) or set(measured) != {*RUN_SETTINGS, "spans"}:
            raise ValueError(f"measured must be one run, a dict with the keys schedule, stages, micro_batches and "
                             f"spans, got {measured!r:.200}")
        run = {k: measured[k] for k in RUN_SETTINGS}
    values = {"schedule": "1f1b", "stages": 4, "micro_batches": 8, **run, **start}
    fixed = {k: v for k, v in values.items() if k not in RUN_SETTINGS}
    controls = {
        "schedule": w.Dropdown(options=list(pipeline.SCHEDULES), value=values["schedule"], description="schedule",
                               style=STYLE),
        "stages": int_slider(values["stages"], low=2, high=16, description="stages"),
        "micro_batches": int_slider(values["micro_batches"], low=1, high=64, description="micro-batches"),
    }

    def draw_view(measured=None, **current):
        return draw(measured=measured, **current, **fixed)

    def describe_view(**current):
        return describe(**current, **fixed)

    spans = measured["spans"] if measured is not None else None
    return show_view(draw_view, describe_view, controls, spans, run)

"""Hybrid parallelism on a grid of GPUs: every data x model grid, its step time and its bytes.

    hybrid_view.show(measured={Grid(2, 2): {"step": 0.004, "sent": 561_064}})   # in a notebook
    fig = hybrid_view.draw(model="Krizhevsky 2012 (ImageNet)", scheme="paper")  # the figure alone

One row per grid of 1, 2, 4, ... up to `gpus` ranks (`configurations`). Left: the
time model's step on one rank (`course.grid_model.step`, whose docstring states the
assumptions), compute then communication, labelled with the speed-up over one GPU.
Right: the bytes each rank sends per step. Dots: a real run's step time and bytes.
Crosses: Yadan et al.'s Table 1 speed-ups, drawn as one GPU's predicted step divided
by the paper's speed-up, where the settings are the paper's (Krizhevsky's network,
batch 256, a TITAN, the paper's scheme). A grid the model cannot run (the batch does
not split over its ranks, a layer does not split over its model-parallel group) is
said in words in its row.

The processor menu holds, beside timemodel's presets, the TITAN without its full-batch
assumption (`grid_model.TITAN_NO_FULL_BATCH`): switching between the two shows which
bars that assumption sets. The backward of a gather is counted as the link's backend
runs it (`backend_of`): gloo's all-reduce on the local gloo link, NCCL's reduce-scatter
on every GPU link.

Used in: lab 4 (04_hybrid), the demo (solutions/demo.ipynb).
"""
from __future__ import annotations

from collections.abc import Mapping
from functools import partial

import matplotlib.pyplot as plt

from course import grid_model, sizes, timemodel
from course.grid_model import Grid
from course.widgets import STYLE, run_controls, show_view

LAB_CONVNET = "lab 4's convnet (digits)"
KRIZHEVSKY_2012 = "Krizhevsky 2012 (ImageNet)"
MODELS = {LAB_CONVNET: grid_model.convnet_layers(), KRIZHEVSKY_2012: grid_model.KRIZHEVSKY}
GPUS = (1, 2, 4, 8, 16)
COLOURS = {"compute": "#6baed6", "communication": "#de2d26", "sent": "#fc9272"}
PAPER_LABEL = "Yadan et al., Table 1"
#: what a measured step and its bytes depend on, besides the grid (one dot per grid)
RUN_SETTINGS = ("model", "batch", "dtype", "link", "processor", "scheme")
#: the processors of the menu besides timemodel's presets
EXTRA_PROCESSORS = {grid_model.TITAN_NO_FULL_BATCH.name: grid_model.TITAN_NO_FULL_BATCH}
#: the processors whose bars the paper's crosses may sit beside
TITANS = (timemodel.TITAN.name, grid_model.TITAN_NO_FULL_BATCH.name)


def backend_of(link: str) -> str:
    """The backend whose collectives a link's bars count: gloo on the local gloo link, else NCCL."""
    return "gloo" if link == timemodel.LOCAL_GLOO.name else "nccl"


def _processors(extra: Mapping[str, timemodel.Processor] | None) -> dict:
    return {**timemodel.PROCESSORS, **EXTRA_PROCESSORS, **(extra or {})}


def configurations(gpus: int) -> list[Grid]:
    """Every data x model grid of 1, 2, 4, ... `gpus` ranks: by ranks, then most data-parallel first."""
    if gpus not in GPUS:
        raise ValueError(f"gpus must be a power of two from 1 to 16 ({', '.join(map(str, GPUS))}), got {gpus!r}")
    counts = [n for n in GPUS if n <= gpus]
    return [Grid(ranks // model, model) for ranks in counts for model in counts if model <= ranks]


def _named(what: str, name: str, choices: Mapping):
    if name not in choices:
        raise ValueError(f"{what} must be one of {list(choices)}, got {name!r}")
    return choices[name]


def _predict(layers, grids, batch, processor, link, scheme, dtype) -> dict:
    """grid -> grid_model.step's dict, or the reason the model cannot run that grid."""
    predicted = {}
    for grid in grids:
        try:
            predicted[grid] = grid_model.step(layers, grid, batch, processor, link, scheme, dtype,
                                              backend_of(link.name))
        except ValueError as error:
            predicted[grid] = str(error)
    return predicted


def draw(*, model: str = LAB_CONVNET, batch: int = 256, gpus: int = 4, dtype: str = "float32",
         link: str = timemodel.PCIE3_X16.name, processor: str = timemodel.TITAN.name, scheme: str = "lab",
         measured: Mapping[Grid, Mapping[str, float]] | None = None,
         processors: Mapping[str, timemodel.Processor] | None = None):
    """The view as a matplotlib Figure (see the module docstring).

    measured: grid -> {"step": seconds, "sent": bytes} of a real run at these settings;
    processors: name -> Processor, looked up before timemodel's presets."""
    layers = _named("model", model, MODELS)
    _named("scheme", scheme, dict.fromkeys(grid_model.SCHEMES))
    sizes.nbytes(0, dtype)                                       # an unknown dtype: ValueError here
    gpu = _named("processor", processor, _processors(processors))
    interconnect = timemodel.link_named(link)
    grids = configurations(gpus)
    predicted = _predict(layers, grids, batch, gpu, interconnect, scheme, dtype)
    runs = {y: p for y, p in enumerate(predicted.values()) if isinstance(p, dict)}
    one = predicted[Grid(1, 1)]["step"] if isinstance(predicted[Grid(1, 1)], dict) else None

    height = max(3.0, 1.6 + 0.45 * len(grids))
    fig, (time_ax, sent_ax) = plt.subplots(1, 2, sharey=True, figsize=(12, height), layout="constrained")
    ys = list(runs)
    compute = [runs[y]["compute"] * 1e3 for y in ys]
    time_ax.barh(ys, compute, color=COLOURS["compute"], label="compute")
    time_ax.barh(ys, [runs[y]["communication"] * 1e3 for y in ys], left=compute,
                 color=COLOURS["communication"], label="communication")
    sent_ax.barh(ys, [runs[y]["sent"] / 1e6 for y in ys], color=COLOURS["sent"])
    step_labels = {}
    for y, grid in enumerate(grids):
        if y not in runs:
            time_ax.text(0, y, f" cannot run: {predicted[grid]}", va="center", fontsize="small", color="dimgrey")
            continue
        step_ms = runs[y]["step"] * 1e3
        speedup = f", ×{one / runs[y]['step']:.2f}" if one and runs[y]["step"] else ""
        step_labels[y] = f"{step_ms:.3g} ms{speedup}"
        sent_ax.text(runs[y]["sent"] / 1e6, y, f" {runs[y]['sent'] / 1e6:.3g} MB", va="center", fontsize="small")
    # the step times as labels outside the right edge: no bar or dot can land on them, at any font size
    step_column = time_ax.secondary_yaxis("right")
    step_column.set_yticks(list(step_labels), list(step_labels.values()), fontsize="small")
    step_column.tick_params(length=0)

    dots = [(grids.index(grid), values) for grid, values in (measured or {}).items() if grid in grids]
    if dots:
        rows = [y for y, _ in dots]
        time_ax.plot([v["step"] * 1e3 for _, v in dots], rows, "o", color="black", zorder=3, label="measured")
        sent_ax.plot([v["sent"] / 1e6 for _, v in dots], rows, "o", color="black", zorder=3, label="measured")
    paper = (model == KRIZHEVSKY_2012 and batch == grid_model.PAPER_BATCH and processor in TITANS
             and scheme == "paper")
    table = [row for row in grid_model.TABLE_1 if row.grid in grids]
    if paper and one and table:
        time_ax.plot([one * 1e3 / row.speedup for row in table], [grids.index(row.grid) for row in table],
                     "x", color="black", markersize=9, zorder=3, label=PAPER_LABEL)

    time_ax.set_yticks(range(len(grids)), [str(grid) for grid in grids])
    time_ax.set_ylim(len(grids) - 0.5, -0.5)                     # one GPU at the top
    time_ax.set_xlabel("ms per step on one rank (time model)")
    time_ax.set_title("step time, × speed-up over one GPU", fontsize="medium")
    longest = max([p["step"] for p in runs.values()] + [v["step"] for _, v in dots], default=0) * 1e3
    time_ax.set_xlim(0, 1.1 * longest or 1)
    sent_ax.set_xlabel("MB sent per rank per step")
    sent_ax.set_title(f"{dtype} tensors,\nring collectives as {backend_of(link)} runs them", fontsize="medium")
    sent_ax.margins(x=0.3)
    sent_ax.set_xlim(left=0)
    fig.suptitle(f"{model}, batch {batch}, on {processor} over {link}; scheme {scheme!r}", fontsize="medium",
                 wrap=True)
    # below both panels, in room the layout makes for it at any type size: never over a bar
    fig.legend(*time_ax.get_legend_handles_labels(), loc="outside lower center", ncol=4, fontsize="small",
               frameon=False)
    return fig


def describe(*, model: str, batch: int, gpus: int, dtype: str, link: str, processor: str, scheme: str,
             processors: Mapping[str, timemodel.Processor] | None = None) -> str:
    """The figure's headline numbers, in a line of markdown: one GPU's step, and the fastest grid's."""
    gpu = _named("processor", processor, _processors(processors))
    predicted = _predict(_named("model", model, MODELS), configurations(gpus), batch, gpu, timemodel.link_named(link),
                         scheme, dtype)
    runs = {grid: p for grid, p in predicted.items() if isinstance(p, dict)}
    one = runs.get(Grid(1, 1))
    if one is None or len(runs) < 2:
        return f"**{model}, batch {batch}:** no grid of 2 to {gpus} GPUs runs here; the figure says why."
    fastest = min(runs, key=lambda grid: runs[grid]["step"])
    best = runs[fastest]
    return (f"**{model}, batch {batch}, scheme {scheme!r}, on {processor} over {link}:** one GPU takes "
            f"{one['step'] * 1e3:.3g} ms per step; the fastest grid of up to {gpus} GPUs is **{fastest}**, "
            f"{best['step'] * 1e3:.3g} ms (**×{one['step'] / best['step']:.2f}**), each rank sending "
            f"{best['sent'] / 1e6:.3g} MB per step.")


def show(measured: Mapping[Grid, Mapping[str, float]] | None = None,
         processors: Mapping[str, timemodel.Processor] | None = None, **start):
    """The view with menus and sliders (a static figure under grading or headless).

    measured: a real run's step seconds and bytes per rank, by grid; `start` gives that
    run's settings (model, scheme, batch, dtype, link, processor), which the controls
    start at. Measured dots show while those settings are unchanged, whatever `gpus`.
    processors: extra processors (say, this machine's CPU, measured) for the GPU menu.
    """
    import ipywidgets as w

    processors = {**EXTRA_PROCESSORS, **(processors or {})}
    values = {"model": LAB_CONVNET, "scheme": "lab", "batch": 256, "gpus": 4, "dtype": "float32",
              "link": timemodel.PCIE3_X16.name, "processor": timemodel.TITAN.name, **start}
    controls = {
        "model": w.Dropdown(options=list(MODELS), value=values["model"], description="model", style=STYLE),
        "scheme": w.Dropdown(options=list(grid_model.SCHEMES), value=values["scheme"], description="scheme",
                             style=STYLE),
        **run_controls(values, gpu_counts=GPUS, processors=processors, processor_label="processor"),
    }
    return show_view(partial(draw, processors=processors), partial(describe, processors=processors), controls,
                     measured, {k: values[k] for k in RUN_SETTINGS})

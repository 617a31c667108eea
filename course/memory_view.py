"""What each rank holds and sends under data parallelism, ZeRO-1, -2, -3 and split weights.

    memory_view.show(measured=[{"scheme": "ZeRO-3", "ranks": 2, "memory": 3_600_000, "sent": 5_400_000}],
                     parameters=301_066, precision="fp32", optimizer="adam", ranks=2)   # in a notebook
    fig = memory_view.draw()            # the ZeRO paper's Figure 1 settings, on V100s

Left: the bytes one rank holds, stacked by kind (parameters, gradients, optimizer state, and
activations where given), for each scheme (`course.memory.per_rank`, whose docstring says
what is assumed), with the chosen GPU's memory as a line. Middle: the bytes each rank sends
per step with ring collectives (`memory.sent_per_step`); split weights send activations, so
their bar needs the model's layers and a batch (`show(layers=..., batch=...)`), and the
figure says so without them. Right: the largest model whose state fits the chosen GPU under
each scheme, against the number of ranks (`memory.largest_model`; activations excluded).
Dots: a real run's bytes per rank, on the left and middle panels, at the run's settings
and its number of ranks only. Crosses: the ZeRO paper's Figure 1 (its numbers, rounded as it
rounds them), at its settings only: 7.5 B parameters, Adam, mixed precision, 64 ranks.
The precision menu has the paper's mixed precision (16 bytes a parameter with Adam) and bf16
with fp32 gradients as practised (18; `course.memory`'s docstring says where each comes from).

This view says `ranks` where the others say `gpus`: it counts the group the state is sharded over
(CONTRIBUTING.md, "Words", says why).

Used in: lab 5 (05_sharded_data_parallel), the demo (solutions/demo.ipynb).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import matplotlib.pyplot as plt
import numpy as np

from course import memory
from course.widgets import STYLE, show_view

#: the model sizes of the menu, in parameters; a run's own is added by show()
MODELS = {"1 million": 10**6, "10 million": 10**7, "100 million": 10**8, "1 billion": 10**9,
          "7.5 billion (ZeRO paper, Figure 1)": memory.ZERO_FIGURE_1["parameters"], "10 billion": 10**10,
          "100 billion": 10**11, "1 trillion": 10**12}
RANKS = tuple(2**k for k in range(11))          # 1 to 1024
KINDS = (*memory.KINDS, "activations")
COLOURS = {"parameters": "#3182bd", "gradients": "#de2d26", "optimizer state": "#31a354", "activations": "#969696"}
SCHEME_COLOURS = {"data parallel": "#636363", "ZeRO-1": "#fd8d3c", "ZeRO-2": "#e6550d", "ZeRO-3": "#a63603",
                  "split weights": "#756bb1"}
#: what a measured run's bytes depend on besides its number of ranks (each dot has its own)
RUN_SETTINGS = ("parameters", "precision", "optimizer")
#: what activations (bytes per rank, given for one run) depend on among the controls
ACTIVATIONS_DEPEND_ON = ("parameters", "precision", "ranks")
PAPER_LABEL = "ZeRO paper, Figure 1"
#: each scheme's name under its bars, on two lines where it has two words: five side by side in a
#: third of the figure, readable in a projector's type (plots.projector)
TICKS = [scheme.replace(" ", "\n") for scheme in memory.SCHEMES]
_UNITS = ((1e12, "TB"), (1e9, "GB"), (1e6, "MB"), (1e3, "kB"), (1, "bytes"))


def unit_of(nbytes: float) -> tuple[float, str]:
    """The decimal unit (1e9: "GB", the ZeRO paper's) a figure's largest number of bytes reads in."""
    return next(((size, name) for size, name in _UNITS if nbytes >= size), _UNITS[-1])


def in_units(nbytes: float) -> str:
    size, name = unit_of(nbytes)
    return f"{nbytes / size:.3g} {name}"


def _label_bar(ax, x: float, top: float, nbytes: float) -> None:
    """A bar's bytes above it, number over unit (narrow enough for five bars side by side), clear of
    a measured dot or a paper's cross on the bar's top."""
    ax.annotate(in_units(nbytes).replace(" ", "\n"), (x, top), xytext=(0, 7), textcoords="offset points",
                ha="center", va="bottom", fontsize="small")


def count_words(parameters: int) -> str:
    """7_500_000_000 -> "7.5 billion"."""
    for size, name in ((1e12, "trillion"), (1e9, "billion"), (1e6, "million"), (1e3, "thousand")):
        if parameters >= size:
            return f"{parameters / size:.3g} {name}"
    return f"{parameters}"


def is_zero_figure_1(**settings) -> bool:
    """True at the ZeRO paper's Figure 1 settings (7.5 B parameters, Adam, mixed precision, 64 ranks)."""
    return all(settings[k] == memory.ZERO_FIGURE_1[k] for k in ("parameters", "ranks", "optimizer", "precision"))


def label(precision: str) -> str:
    """How a title names a precision: "mixed precision", "bf16 parameters, fp32 gradients"."""
    if precision not in memory.PRECISIONS:
        raise ValueError(f"precision must be one of {list(memory.PRECISIONS)}, got {precision!r}")
    return memory.PRECISIONS[precision].label


def _gpu(name: str) -> memory.GpuMemory:
    if name not in memory.GPUS:
        raise ValueError(f"gpu must be one of {list(memory.GPUS)}, got {name!r}")
    return memory.GPUS[name]


def held(parameters: int, ranks: int, *, precision: str, optimizer: str, activations=None) -> dict[str, dict]:
    """scheme -> memory.per_rank's bytes by kind and total."""
    return {scheme: memory.per_rank(parameters, ranks, scheme, optimizer=optimizer, precision=precision,
                                    activations=activations) for scheme in memory.SCHEMES}


def sent(parameters: int, ranks: int, *, precision: str, layers=None, batch=None) -> dict[str, float | str]:
    """scheme -> bytes each rank sends per step, or (split weights) the reason it cannot be counted."""
    if precision not in memory.PRECISIONS:
        raise ValueError(f"precision must be one of {list(memory.PRECISIONS)}, got {precision!r}")
    dtypes = memory.PRECISIONS[precision]
    counts = {}
    for scheme in memory.SCHEMES:
        try:
            counts[scheme] = memory.sent_per_step(parameters, ranks, scheme, dtype=dtypes.gradients,
                                                  gather_dtype=dtypes.parameters, layers=layers, batch=batch)
        except ValueError as error:
            if scheme != "split weights":
                raise
            counts[scheme] = ("needs the model's layers and a batch" if layers is None or batch is None
                              else str(error))
    return counts


def _check_measured(measured) -> list[dict]:
    runs = list(measured or [])
    for run in runs:
        if not isinstance(run, Mapping) or set(run) != {"scheme", "ranks", "memory", "sent"}:
            raise ValueError(f"each measured run must be a dict with the keys scheme, ranks, memory (bytes per "
                             f"rank) and sent (bytes per rank per step), got {run!r}")
        if run["scheme"] not in memory.SCHEMES:
            raise ValueError(f"a measured run's scheme must be one of {memory.SCHEMES}, got {run['scheme']!r}")
    return runs


def draw(*, parameters: int = memory.ZERO_FIGURE_1["parameters"], precision: str = "mixed", optimizer: str = "adam",
         ranks: int = memory.ZERO_FIGURE_1["ranks"], gpu: str = "NVIDIA V100 (32 GB)", activations=None,
         layers=None, batch: int | None = None, measured: Sequence[Mapping] | None = None):
    """The view as a matplotlib Figure (see the module docstring).

    activations: bytes of activations per rank, stacked on every scheme's bar; layers and batch:
    the model's `sizes.Dense` layers and the samples per step, for split weights' bytes;
    measured: [{"scheme", "ranks", "memory", "sent"}] of a real run at these settings ("sent" None: not measured)."""
    device = _gpu(gpu)
    holds = held(parameters, ranks, precision=precision, optimizer=optimizer, activations=activations)
    sends = sent(parameters, ranks, precision=precision, layers=layers, batch=batch)
    dots = [run for run in _check_measured(measured) if run["ranks"] == ranks]
    x = {scheme: i for i, scheme in enumerate(memory.SCHEMES)}
    fig, (held_ax, sent_ax, fit_ax) = plt.subplots(1, 3, figsize=(15, 6), width_ratios=(1.3, 1.3, 1),
                                                   layout="constrained")   # the bars' panels get the room

    top = max([h["total"] for h in holds.values()] + [run["memory"] for run in dots])
    size, unit = unit_of(top)
    bottom = np.zeros(len(memory.SCHEMES))
    for kind in KINDS:
        if kind not in holds["data parallel"]:
            continue
        heights = np.array([holds[scheme][kind] for scheme in memory.SCHEMES]) / size
        held_ax.bar(list(memory.SCHEMES), heights, bottom=bottom, color=COLOURS[kind], label=kind)
        bottom += heights
    for scheme, total in ((s, h["total"]) for s, h in holds.items()):
        _label_bar(held_ax, x[scheme], total / size, total)
    held_ax.set_xticks(range(len(memory.SCHEMES)), TICKS)
    held_ax.tick_params(axis="x", labelsize="small")
    held_ax.set_ylim(0, 1.3 * top / size or 1)   # room above the tallest bar for its two-line label
    if device.nbytes <= 1.2 * top:
        held_ax.axhline(device.nbytes / size, color="black", linestyle="--", linewidth=1,
                        label=f"{device.name}: {in_units(device.nbytes)}")
    else:   # said in words, under the panel: over the bars it would cover their labels
        held_ax.set_xlabel(f"{device.name}: {in_units(device.nbytes)}, above this scale", fontsize="small", wrap=True)
    if dots:
        held_ax.plot([x[run["scheme"]] for run in dots], [run["memory"] / size for run in dots], "o",
                     color="black", zorder=3, label="measured")
    if is_zero_figure_1(parameters=parameters, ranks=ranks, optimizer=optimizer, precision=precision):
        paper = memory.ZERO_FIGURE_1["GB"]
        held_ax.plot([x[scheme] for scheme in paper], [gb * 1e9 / size for gb in paper.values()], "x",
                     color="black", markersize=9, zorder=3, label=PAPER_LABEL)
    held_ax.set_ylabel(f"{unit} held per rank")
    held_ax.set_title("memory per rank", fontsize="medium")   # the optimizer and precision: in the figure's title
    # under the figure, not over the bars it names (nor squeezing the panel, as a legend under it would)
    fig.legend(*held_ax.get_legend_handles_labels(), fontsize="small", frameon=False, loc="outside lower center",
               ncols=4)

    counted = {scheme: b for scheme, b in sends.items() if not isinstance(b, str)}
    sent_dots = [run for run in dots if run["sent"] is not None]   # a run may have measured memory only
    sent_size, sent_unit = unit_of(max([*counted.values(), *(run["sent"] for run in sent_dots), 1]))
    sent_ax.bar(list(counted), [b / sent_size for b in counted.values()],
                color=[SCHEME_COLOURS[s] for s in counted])
    sent_ax.set_xticks(range(len(memory.SCHEMES)), TICKS)
    sent_ax.tick_params(axis="x", labelsize="small")
    for scheme, b in sends.items():
        if isinstance(b, str):      # said in words, under the panel: no bar to hang it on
            sent_ax.set_xlabel(f"{scheme}: {b}", fontsize="small", wrap=True)
        else:
            _label_bar(sent_ax, x[scheme], b / sent_size, b)
    if sent_dots:
        sent_ax.plot([x[run["scheme"]] for run in sent_dots], [run["sent"] / sent_size for run in sent_dots], "o",
                     color="black", zorder=3, label="measured")
        sent_ax.legend(fontsize="small", frameon=False)
    sent_ax.set_ylabel(f"{sent_unit} sent per rank per step")
    sent_ax.set_title("ring collectives, per step", fontsize="medium")
    sent_ax.margins(y=0.3)

    counts = sorted(set(RANKS) | {ranks})
    for scheme in memory.SCHEMES:
        largest = [memory.largest_model(device.nbytes, n, scheme, optimizer=optimizer, precision=precision)
                   for n in counts]
        fit_ax.plot(counts, largest, color=SCHEME_COLOURS[scheme], label=scheme,
                    linestyle="--" if scheme == "split weights" else "-")
    fit_ax.axhline(parameters, color="grey", linestyle=":", linewidth=1, label=f"this model: {count_words(parameters)}")
    fit_ax.axvline(ranks, color="grey", linestyle=":", linewidth=1)
    fit_ax.set_xscale("log", base=2)
    fit_ax.set_yscale("log")
    fit_ax.set_xlabel("ranks")
    fit_ax.set_ylabel("parameters")
    fit_ax.set_title(f"the largest model that fits\n{device.name}\n(no activations)", fontsize="medium")
    fit_ax.legend(fontsize="small", frameon=False)
    fig.suptitle(f"{count_words(parameters)} parameters, {optimizer}, {label(precision)}, {ranks} ranks",
                 fontsize="medium")
    return fig


def describe(*, parameters: int, precision: str, optimizer: str, ranks: int, gpu: str, activations=None,
             layers=None, batch: int | None = None) -> str:
    """The figure's numbers in markdown: each scheme's bytes per rank (and whether they fit),
    its bytes sent per step, and the largest model that fits."""
    device, settings = _gpu(gpu), {"optimizer": optimizer, "precision": precision}
    holds = held(parameters, ranks, activations=activations, **settings)
    sends = sent(parameters, ranks, precision=precision, layers=layers, batch=batch)
    memory_words = "; ".join(f"{scheme} {in_units(h['total'])}" + ("" if h["total"] <= device.nbytes else " (too big)")
                             for scheme, h in holds.items())
    sent_words = "; ".join(f"{scheme} {in_units(b)}" for scheme, b in sends.items() if not isinstance(b, str))
    largest = "; ".join(f"{scheme} {count_words(memory.largest_model(device.nbytes, ranks, scheme, **settings))}"
                        for scheme in memory.SCHEMES)
    given = f", {in_units(activations)} of activations included" if activations is not None else ""
    split = sends["split weights"]
    return (f"**{count_words(parameters)} parameters, {optimizer}, {label(precision)}, {ranks} ranks, "
            f"{device.name}:** each rank holds {memory_words}{given}. Each rank sends per step {sent_words}"
            f"{f' (split weights: {split})' if isinstance(split, str) else ''}. "
            f"The largest model one {device.name} holds on {ranks} ranks (activations excluded): {largest} parameters.")


def show(measured: Sequence[Mapping] | None = None, *, layers=None, batch: int | None = None,
         activations=None, **start):
    """The view with menus and a slider (a static figure under grading or headless).

    measured: a real run's bytes per rank, [{"scheme", "ranks", "memory", "sent"}]; `start` gives
    that run's settings (parameters, precision, optimizer, ranks, gpu), which the controls start
    at; its dots show while parameters, precision and optimizer are the run's, each at its own
    number of ranks. activations: bytes per rank of the run's activations, shown while parameters,
    precision and ranks are the run's. layers and batch: the model's, for split weights' bytes.
    """
    import ipywidgets as w

    values = {**{k: memory.ZERO_FIGURE_1[k] for k in ("parameters", "precision", "optimizer", "ranks")},
              "gpu": "NVIDIA V100 (32 GB)", **start}
    values["parameters"] = memory.check_parameters(values["parameters"])
    models = [(name, count) for name, count in MODELS.items()]
    if values["parameters"] not in MODELS.values():
        models.append((f"{count_words(values['parameters'])} (this run)", values["parameters"]))
    models.sort(key=lambda option: option[1])
    counts = sorted(set(RANKS) | {values["ranks"]} | {run["ranks"] for run in _check_measured(measured)})
    controls = {
        "parameters": w.Dropdown(options=models, value=values["parameters"], description="model", style=STYLE),
        "precision": w.Dropdown(options=list(memory.PRECISIONS), value=values["precision"], description="precision",
                                style=STYLE),
        "optimizer": w.Dropdown(options=list(memory.OPTIMIZER_STATES), value=values["optimizer"],
                                description="optimizer", style=STYLE),
        "ranks": w.SelectionSlider(options=counts, value=values["ranks"], description="ranks", style=STYLE),
        "gpu": w.Dropdown(options=list(memory.GPUS), value=values["gpu"], description="GPU", style=STYLE),
    }

    def extra(current) -> dict:
        same = all(current[name] == values[name] for name in ACTIVATIONS_DEPEND_ON)
        return {"activations": activations if same else None, "layers": layers, "batch": batch}

    def draw_view(measured=None, **current):
        return draw(measured=measured, **current, **extra(current))

    def describe_view(**current):
        return describe(**current, **extra(current))

    return show_view(draw_view, describe_view, controls, measured, {k: values[k] for k in RUN_SETTINGS})

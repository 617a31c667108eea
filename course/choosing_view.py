"""The course's closing view: every parallel layout of a model on a cluster, its bytes and its step time.

    choosing_view.show()                                    # in a notebook: menus for model, cluster, ...
    fig = choosing_view.draw(model="GPT-3 6.7B", nodes=8)   # the figure alone

Left: one marker per layout (`course.choosing.options`, whose docstring states the model and what it
assumes): x the bytes each rank sends per step, y the predicted step time, both logarithmic; the colour
says which parallelisms the layout uses (dp, dp+zero, tp, pp and their mixes), a triangle one that also
splits each sequence over cp ranks (context parallelism, lab 7's ring attention: offered when the context
box is ticked), a square one that splits a mixture of experts' experts over ep of its dp copies (expert
parallelism, course.experts: offered for the models with experts), a diamond both; a hollow marker one
that does not fit in the GPU's memory; a star the fastest that fits,
named. A layout that sends nothing
(one GPU) is drawn at 1 byte. Right: the five fastest layouts that fit. The activations menu
(`ACTIVATIONS`) says what each transformer layer keeps for its backward (`course.activations`, Korthikanti
et al. 2022): by default all but attention's s² scores, which are recomputed, as FlashAttention does.

Measured dots: the labs' real runs, {"lab", "scheme", "ranks", "sent", "seconds"} (bytes per rank per step,
and the measured step time, which may be missing). They are drawn only when the model is the labs' MLP and
the cluster this machine (`choosing.LAB_MLP`, `choosing.LOCAL`): the settings they ran at. A CPU run's
step time says nothing about an H100 cluster. A run without a step time is a tick on the bytes axis.

Used in: lab 6 (06_pipeline_parallel).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import matplotlib.pyplot as plt

from course import choosing, memory
from course.memory_view import in_units
from course.widgets import STYLE, show_view

#: the combinations of parallelisms, each its own colour (Layout.uses)
USES = ("none", "dp", "dp+zero", "tp", "pp", "dp+tp", "dp+zero+tp", "dp+pp", "dp+zero+pp", "tp+pp", "dp+tp+pp",
        "dp+zero+tp+pp")
COLOURS = dict(zip(USES, ("#000000", "#1f77b4", "#17becf", "#d62728", "#2ca02c", "#9467bd", "#e377c2",
                          "#bcbd22", "#8c564b", "#ff7f0e", "#7f7f7f", "#393b79")))
NODES = (1, 2, 4, 8, 16, 32, 64, 128)
BATCHES = tuple(2**k for k in range(3, 13))      # 8 to 4096 samples
#: where the measured runs ran: the labs' MLP on this machine's CPU ranks
RUN_SETTINGS = {"model": choosing.LAB_MLP, "cluster": choosing.LOCAL}
MEASURED_KEYS = {"lab", "scheme", "ranks", "sent"}
TOP = 5
#: the activations menu: what each layer keeps (`course.activations`), as (recompute, sequence_parallel);
#: the first is the default, what FlashAttention-era training does at the least
ACTIVATIONS = {
    "attention recomputed (FlashAttention)": ("selective", False),
    "attention recomputed + sequence parallelism": ("selective", True),
    "every layer recomputed (checkpointing)": ("full", False),
    "everything stored (the s² attention scores too)": ("none", False),
}
DEFAULT_ACTIVATIONS = next(iter(ACTIVATIONS))


def _named(what: str, name: str, choices: Mapping):
    if name not in choices:
        raise ValueError(f"{what} must be one of {list(choices)}, got {name!r}")
    return choices[name]


def layout_words(layout: choosing.Layout) -> str:
    """Layout(8, 2, 1, 8, 64) -> "dp 8 (ZeRO-2) × tp 1 × pp 8, m 64"; with cp 2, "... × pp 8 × cp 2, m 64";
    with ep 4, "dp 8 (ZeRO-2, ep 4) × ...": the experts split over groups of 4 of the dp copies."""
    dp = ", ".join(([f"ZeRO-{layout.zero}"] if layout.zero else []) + ([f"ep {layout.ep}"] if layout.ep > 1 else []))
    cp = f" × cp {layout.cp}" if layout.cp > 1 else ""
    return f"dp {layout.dp}{f' ({dp})' if dp else ''} × tp {layout.tp} × pp {layout.pp}{cp}, m {layout.m}"


def _colour_of(layout: choosing.Layout) -> str:
    """Layout.uses without cp and ep, which the marker's shape says (MARKERS)."""
    return "+".join(part for part in layout.uses.split("+") if part not in ("cp", "ep")) or "none"


#: (splits each sequence over cp ranks, splits the experts over ep ranks) -> the marker
MARKERS = {(False, False): "o", (True, False): "^", (False, True): "s", (True, True): "D"}
MARKER_WORDS = {"^": "triangle: with cp", "s": "square: with ep", "D": "diamond: with cp and ep"}


def _check_measured(measured) -> list[dict]:
    runs = list(measured or [])
    for run in runs:
        if not isinstance(run, Mapping) or not MEASURED_KEYS <= set(run) <= MEASURED_KEYS | {"seconds"}:
            raise ValueError(f"each measured run must be a dict with the keys lab, scheme, ranks, sent (bytes per "
                             f"rank per step) and, if measured, seconds (the step time), got {run!r}")
    return runs


def _options(model: str, cluster: str, nodes: int, batch: int | None, precision: str, activations: str,
             context: bool):
    chosen, where = _named("model", model, choosing.MODELS), _named("cluster", cluster, choosing.CLUSTERS)
    recompute, sequence_parallel = _named("activations", activations, ACTIVATIONS)
    if not isinstance(context, bool):
        raise ValueError(f"context must be True or False (offer context-parallel layouts, or not), got {context!r}")
    batch = chosen.batch if batch is None else batch
    return chosen, where, batch, choosing.options(chosen, where, batch, nodes=nodes, precision=precision,
                                                  recompute=recompute, sequence_parallel=sequence_parallel,
                                                  context=context)


def _headline(chosen, where, nodes, batch, precision, activations, context) -> str:
    return (f"{chosen.name}, batch {batch}, {precision} precision, {activations}"
            f"{', context parallelism offered' if context else ''}, on {nodes} "
            f"node{'s' * (nodes > 1)} of {where.name}: {nodes * where.gpus_per_node} ranks")


def draw(*, model: str = "GPT-3 6.7B", cluster: str = choosing.H100_CLUSTER, nodes: int = 8,
         batch: int | None = None, precision: str = "mixed", activations: str = DEFAULT_ACTIVATIONS,
         context: bool = False, measured: Sequence[Mapping] | None = None):
    """The view as a matplotlib Figure (see the module docstring); batch None: the model's own;
    activations: a key of ACTIVATIONS; context: context-parallel layouts offered too."""
    chosen, where, batch, found = _options(model, cluster, nodes, batch, precision, activations, context)
    runs = _check_measured(measured) if (model, cluster) == tuple(RUN_SETTINGS.values()) else []
    best = choosing.fastest(found)
    fig, (ax, table_ax) = plt.subplots(1, 2, figsize=(15, 5.2), layout="constrained", width_ratios=(1.6, 1))
    for uses in USES:
        for fits in (True, False):
            for splits, marker in MARKERS.items():
                group = [o for o in found if _colour_of(o.layout) == uses and o.fits == fits
                         and (o.layout.cp > 1, o.layout.ep > 1) == splits]
                if group:
                    ax.scatter([max(o.sent["total"], 1) for o in group], [o.seconds["total"] for o in group], s=36,
                               marker=marker, facecolors=COLOURS[uses] if fits else "none",
                               edgecolors=COLOURS[uses], label="_")
        if any(_colour_of(o.layout) == uses for o in found):   # one legend entry a colour, a filled circle;
            ax.scatter([], [], s=36, marker="o", color=COLOURS[uses], label=uses)   # hollow and shapes below
    for marker in sorted({MARKERS[o.layout.cp > 1, o.layout.ep > 1] for o in found} & set(MARKER_WORDS),
                         key=list(MARKER_WORDS).index):
        ax.scatter([], [], s=36, marker=marker, facecolors="grey", edgecolors="grey", label=MARKER_WORDS[marker])
    if not all(o.fits for o in found):
        ax.scatter([], [], s=36, facecolors="none", edgecolors="grey", label="hollow: does not fit in memory")
    if best:
        ax.plot([max(best.sent["total"], 1)], [best.seconds["total"]], "*", color="gold", markeredgecolor="black",
                markersize=20, zorder=4, label="the fastest that fits")
        ax.annotate(layout_words(best.layout), (max(best.sent["total"], 1), best.seconds["total"]),
                    xytext=(10, -14), textcoords="offset points", fontsize="small")
    timed = [run for run in runs if run.get("seconds") is not None]
    if timed:
        ax.plot([run["sent"] for run in timed], [run["seconds"] for run in timed], "o", color="black",
                markersize=5, zorder=5, label="measured (the labs' runs)")
        for run in timed:
            ax.annotate(f"lab {run['lab']}, {run['scheme']}, {run['ranks']} ranks", (run["sent"], run["seconds"]),
                        xytext=(5, 4), textcoords="offset points", fontsize="x-small")
    for run in (run for run in runs if run.get("seconds") is None):
        ax.axvline(max(run["sent"], 1), ymax=0.04, color="black", linewidth=2)
    if found:
        ax.set_xscale("log")
        ax.set_yscale("log")
    else:
        ax.text(0.5, 0.5, f"no layout runs a batch of {batch} on {nodes * where.gpus_per_node} GPUs",
                transform=ax.transAxes, ha="center")
    ax.set_xlabel("bytes sent per rank per step")
    ax.set_ylabel("predicted step time (s)")
    ax.set_title(_headline(chosen, where, nodes, batch, precision, activations, context), fontsize="medium",
                 wrap=True)
    _table(table_ax, found, where)
    table_ax.legend(*ax.get_legend_handles_labels(), fontsize="small", frameon=False, loc="lower center", ncol=2)
    return fig


def _table(ax, found, where) -> None:
    ax.axis("off")
    top = [o for o in found if o.fits][:TOP]
    if not top:
        ax.text(0.5, 0.5, f"no layout fits in {where.memory.name}'s {in_units(where.memory.nbytes)}",
                ha="center", wrap=True)
        return
    rows = [[layout_words(o.layout), in_units(o.memory["total"]), in_units(o.sent["total"]),
             f"{o.seconds['total']:.3g} s"] for o in top]
    table = ax.table(cellText=rows, colLabels=["layout", "memory a rank", "sent a rank a step", "step"],
                     loc="upper center", cellLoc="left")
    table.auto_set_font_size(False)
    table.set_fontsize(8)
    table.auto_set_column_width(range(4))
    ax.set_title(f"the {len(top)} fastest that fit ({where.memory.name})", fontsize="medium")


def describe(*, model: str = "GPT-3 6.7B", cluster: str = choosing.H100_CLUSTER, nodes: int = 8,
             batch: int | None = None, precision: str = "mixed", activations: str = DEFAULT_ACTIVATIONS,
             context: bool = False) -> str:
    """The figure's numbers in markdown: how many layouts, how many fit, the fastest, the five fastest."""
    chosen, where, batch, found = _options(model, cluster, nodes, batch, precision, activations, context)
    gpus = nodes * where.gpus_per_node
    fitting = [o for o in found if o.fits]
    head = (f"**{_headline(chosen, where, nodes, batch, precision, activations, context)}:** {len(found)} layouts run "
            f"this batch, {len(fitting)} fit in {in_units(where.memory.nbytes)} a rank.")
    best = choosing.fastest(found)
    if best is None:
        return head + (" None fits: more nodes, a smaller batch, sequence or context parallelism or "
                       "recomputing every layer." if found else
                       f" None runs: the batch must split into dp × m micro-batches on {gpus} GPUs.")
    parts = ", ".join(f"{part} {best.seconds[part]:.3g} s"
                      for part in ("compute", "bubble", "tp", "dp", "pp", "cp", "ep")
                      if part not in ("cp", "ep") or getattr(best.layout, part) > 1)
    rows = "\n".join(f"| {layout_words(o.layout)} | {in_units(o.memory['total'])} | {in_units(o.sent['total'])} | "
                     f"{o.seconds['total']:.3g} s |" for o in fitting[:TOP])
    return (f"{head} The fastest that fits: {layout_words(best.layout)}, {in_units(best.memory['total'])} a rank, "
            f"{in_units(best.sent['total'])} sent a rank a step, {best.seconds['total']:.3g} s a step ({parts}).\n\n"
            f"| layout | memory a rank | sent a rank a step | step |\n|---|---|---|---|\n{rows}")


def fastest_table(*, models: Sequence[str], nodes: Sequence[int], activations: Sequence[str] = (DEFAULT_ACTIVATIONS,),
                  cluster: str = choosing.H100_CLUSTER, precision: str = "mixed") -> str:
    """The fastest layout that fits for each model × nodes × activations, at each model's own batch, in
    markdown: which parallelisms it uses, its memory a rank (activations among it), its step."""
    rows = []
    for model in models:
        for count in nodes:
            for kept in activations:
                chosen, where, batch, found = _options(model, cluster, count, None, precision, kept, False)
                best = choosing.fastest(found)
                fit = f"{sum(o.fits for o in found)} of {len(found)}"
                rows.append(f"| {model} | {count} ({count * where.gpus_per_node}) | {kept} | {fit} | " + (
                    f"{layout_words(best.layout)} | {best.layout.uses} | {in_units(best.memory['total'])} "
                    f"({in_units(best.memory['activations'])}) | {best.seconds['total']:.3g} s |" if best
                    else "none fits | | | |"))
    return ("| model | nodes (GPUs) | activations | layouts that fit | the fastest that fits | it uses | "
            "memory a rank (activations) | step |\n|---|---|---|---|---|---|---|---|\n" + "\n".join(rows))


def show(measured: Sequence[Mapping] | None = None, **start):
    """The view with menus (a static figure under grading or headless). measured: the labs' runs,
    [{"lab", "scheme", "ranks", "sent", "seconds"}], drawn while the model is the labs' MLP and the
    cluster this machine; `start`: model, cluster, nodes, batch, precision, activations, context."""
    import ipywidgets as w

    _check_measured(measured)
    values = {"model": "GPT-3 6.7B", "cluster": choosing.H100_CLUSTER, "nodes": 8, "batch": None,
              "precision": "mixed", "activations": DEFAULT_ACTIVATIONS, "context": False, **start}
    _named("model", values["model"], choosing.MODELS)
    _named("activations", values["activations"], ACTIVATIONS)
    if values["batch"] is None:
        values["batch"] = choosing.MODELS[values["model"]].batch
    controls = {
        "model": w.Dropdown(options=list(choosing.MODELS), value=values["model"], description="model", style=STYLE),
        "cluster": w.Dropdown(options=list(choosing.CLUSTERS), value=values["cluster"], description="cluster",
                              style=STYLE),
        "nodes": w.SelectionSlider(options=sorted(set(NODES) | {values["nodes"]}), value=values["nodes"],
                                   description="nodes", style=STYLE),
        "batch": w.Dropdown(options=sorted(set(BATCHES) | {m.batch for m in choosing.MODELS.values()}
                                           | {values["batch"]}),
                            value=values["batch"], description="global batch (samples)", style=STYLE),
        "precision": w.Dropdown(options=list(memory.PRECISIONS), value=values["precision"],
                                description="precision", style=STYLE),
        "activations": w.Dropdown(options=list(ACTIVATIONS), value=values["activations"], description="activations",
                                  style=STYLE),
        "context": w.Checkbox(value=values["context"], description="context parallelism (split each sequence)",
                              style=STYLE),
    }
    return show_view(draw, describe, controls, measured, RUN_SETTINGS)

"""The experts view: bytes a rank sends per layer and step against the tokens a rank, and the experts'
parameters a rank holds against the number of experts, for each way of spreading a layer's experts over
N ranks, with a run's measurements as dots.

    experts_view.show(measured, model=experts_view.LAB_LAYER, experts=4, top_k=2, ranks=2)

Schemes (`course.experts.SCHEMES`), one layer of E experts, k a token:
- "replicated": every rank holds every expert, their gradients all-reduced each step (data parallelism);
- "tensor parallel": every rank holds 1/N of every expert and sees all of the group's N·T tokens;
  the output and the input's gradient all-reduced;
- "expert parallel": every rank holds E/N whole experts; its T tokens' k rows go to them and come
  back, forward and backward (even routing assumed).
Everything drawn is the formula (`course.experts`); the dots are a run's counted bytes.

Used in: lab 8 (08_experts).
"""
from __future__ import annotations

from typing import NamedTuple

import matplotlib.pyplot as plt

from course import experts as cost
from course.memory_view import in_units
from course.widgets import STYLE, int_slider, show_view


class Layer(NamedTuple):
    hidden: int
    parameters_per_expert: int
    element_bytes: int


LAB_LAYER = "the lab's experts (h 16, inner 24, float32)"
LAYERS = {
    LAB_LAYER: Layer(16, 2 * 16 * 24, 4),
    # Mixtral 8x7B (Jiang et al. 2024): SwiGLU experts, three h × 14336 matrices, trained in bf16.
    "Mixtral 8x7B's layer (h 4096, SwiGLU 14336, bf16)": Layer(4096, 3 * 4096 * 14336, 2),
}
COLOURS = dict(zip(cost.SCHEMES, ("tab:gray", "tab:purple", "tab:blue")))
TOKENS = [2 ** k for k in range(4, 21)]       # 16 to a million tokens a rank
EXPERT_COUNTS = [1, 2, 4, 8, 16, 32, 64, 128]


def check_settings(model: str, experts: int, top_k: int, ranks: int, measured) -> None:
    """Refuses, in words, settings the view cannot draw."""
    if model not in LAYERS:
        raise ValueError(f"model must be one of {list(LAYERS)}, got {model!r}")
    cost.check(experts, top_k)
    if not isinstance(ranks, int) or not 1 <= ranks <= experts:
        raise ValueError(f"ranks must be from 1 to the {experts} experts (each rank holds at least one), "
                         f"got {ranks!r}")
    for row in measured or []:
        if not {"scheme", "tokens", "bytes"} <= set(row) or row["scheme"] not in cost.SCHEMES:
            raise ValueError(f"measured rows have the keys scheme (one of {', '.join(cost.SCHEMES)}), tokens and "
                             f"bytes; got {row!r}")


def sent(scheme: str, tokens: float, model: str, experts: int, top_k: int, ranks: int) -> float:
    """Bytes one rank sends for one layer of experts in a step, `tokens` of its own."""
    layer = LAYERS[model]
    if scheme == "replicated":
        return cost.replicated_sent(experts * layer.parameters_per_expert, ranks, layer.element_bytes)
    if scheme == "tensor parallel":
        return cost.tensor_parallel_sent(tokens * ranks, layer.hidden, ranks, layer.element_bytes)
    return cost.sent_per_layer(tokens, layer.hidden, top_k, ranks, layer.element_bytes)


def crossing(model: str, experts: int, top_k: int) -> float:
    """The tokens a rank past which expert parallelism sends more than replicating: 4·k·T·h = 2·E·P."""
    layer = LAYERS[model]
    return experts * layer.parameters_per_expert / (2 * top_k * layer.hidden)


def fitted(experts: int, top_k: int, ranks: int) -> tuple[int, int]:
    """k and the ranks as the sliders may set them, each at most the experts (a token's k are distinct
    experts; each rank holds at least one)."""
    return min(top_k, experts), min(ranks, experts)


def draw(*, model: str = LAB_LAYER, experts: int = 8, top_k: int = 2, ranks: int = 8, measured=None) -> plt.Figure:
    top_k, ranks = fitted(experts, top_k, ranks)
    check_settings(model, experts, top_k, ranks, measured)
    layer = LAYERS[model]
    figure, (moved, held) = plt.subplots(1, 2, figsize=(12, 4.6), layout="constrained")
    for scheme in cost.SCHEMES:
        # tensor parallelism dashed and on top: it sends what expert parallelism sends where k = N, and holds
        # what it holds where N divides E, and both lines must show
        style = dict(color=COLOURS[scheme], label=scheme, linestyle="--" if scheme == "tensor parallel" else "-",
                     zorder=2 + (scheme == "tensor parallel"))
        moved.plot(TOKENS, [sent(scheme, t, model, experts, top_k, ranks) for t in TOKENS], **style)
        counts = [e for e in EXPERT_COUNTS if e >= ranks]
        held.plot(counts, [cost.held_per_rank(scheme, e, layer.parameters_per_expert, ranks) * layer.element_bytes
                           for e in counts], marker=".", **style)
    for row in measured or []:
        moved.scatter([row["tokens"]], [row["bytes"]], color=COLOURS[row["scheme"]], edgecolor="black", zorder=3)
    held.axvline(experts, color="black", linestyle=":", label=f"{experts} experts")
    moved.set(xscale="log", yscale="log", xlabel="tokens a rank, one step", ylabel="bytes",
              title=f"sent per rank, one layer, one step ({ranks} ranks, k = {top_k})")
    held.set(xscale="log", yscale="log", xlabel="experts in the layer", ylabel="bytes",
             title=f"the experts' parameters per rank ({ranks} ranks)")
    for ax in (moved, held):
        ax.legend(fontsize="small")
    figure.suptitle(f"{model}: formula lines, this run's measurements as dots" if measured else model)
    return figure


def describe(*, model: str, experts: int, top_k: int, ranks: int, **_) -> str:
    top_k, ranks = fitted(experts, top_k, ranks)
    layer = LAYERS[model]
    held = {s: cost.held_per_rank(s, experts, layer.parameters_per_expert, ranks) * layer.element_bytes
            for s in cost.SCHEMES}
    return (f"{model}, {experts} experts, k = {top_k}, {ranks} ranks: expert parallelism sends fewer bytes than "
            f"replicating the experts up to {crossing(model, experts, top_k):,.0f} tokens a rank a step, and "
            f"k/N = {top_k}/{ranks} of tensor parallelism's for the same tokens. Per rank: "
            + ", ".join(f"{s} {in_units(held[s])}" for s in cost.SCHEMES) + " of the experts' parameters.")


def show(measured=None, *, model: str = LAB_LAYER, experts: int = 8, top_k: int = 2, ranks: int = 8):
    """The view with its controls; `measured` ([{scheme, tokens, bytes}], the lab's run) drawn while the model,
    the experts, k and the ranks are the run's."""
    import ipywidgets as w

    controls = {
        "model": w.Dropdown(options=list(LAYERS), value=model, description="layer", style=STYLE),
        "experts": int_slider(experts, low=1, high=128, description="experts"),
        "top_k": int_slider(top_k, low=1, high=8, description="experts a token (k)"),
        "ranks": int_slider(ranks, low=1, high=64, description="ranks"),
    }
    return show_view(draw, describe, controls, measured,
                     {"model": model, "experts": experts, "top_k": top_k, "ranks": ranks})

"""The long-sequence view: activation memory per rank and bytes per rank against the sequence length,
for each way of handling activations, with a run's measurements as dots.

    sequence_view.show(measured=run, model="GPT-3 175B", gpu="NVIDIA H100 SXM (80 GB)", tp=8, context=4)
    sequence_view.longest_table(model="LLaMA-2 70B", gpu="NVIDIA H100 SXM (80 GB)", tp=8, context=8)

Schemes (`SCHEMES`), one transformer layer, one sequence (b = 1), 16-bit activations unless the
lab's block is chosen (float32, the lab's own sizes); dropout's masks counted where the model trains
with dropout (`presets.Model.dropout`: the lab's block and GPT-3, not LLaMA-2 or Mixtral):

- "none": everything stored, the s² scores too; "selective": attention's core recomputed;
  "full": each layer's input only, plus, in backward, the one layer being rebuilt, which holds all a
  "none" layer does (`all_layers_bytes` counts it; the per-layer curve draws the inputs alone);
- "tensor parallel": selective, split over tp ranks (10·sbh whole on every rank);
- "sequence parallel": selective, everything split over tp ranks;
- "context parallel": ring attention over `context` ranks (no scores kept), the sequence split;
- "sequence + context": both, tp × context ranks.

Bytes per rank per layer and step: tensor and sequence parallelism, 4 all-reduces of the layer's
activation (their ring bytes; a reduce-scatter and an all-gather send the same); context
parallelism, ring attention's K and V blocks (`activations.ring_attention_sent`), all-gathered K and
V, or Ulysses' all-to-alls of q, K, V and the output (where the heads split over the ranks), K and V
`kv_width` wide (grouped-query attention: LLaMA-2 70B's and Mixtral's 8 K/V heads make the ring's
and the all-gather's bytes 8 and 4 times less than their width would). Everything is the formula
(`course.activations`); the dots are a run's measurements.
The longest sequence that fits: the GPU's memory divided by the layers, activations only (the weights,
gradients and optimizer state take the rest: an assumption the table states).

Used in: lab 7 (07_long_sequences).
"""
from __future__ import annotations

import matplotlib.pyplot as plt

from course import activations, choosing, memory, sizes
from course.widgets import STYLE, int_slider, show_view

LAB_BLOCK = "the lab's block (64 wide, 4 heads, float32)"
SCHEMES = ("none", "selective", "full", "tensor parallel", "sequence parallel", "context parallel",
           "sequence + context")
COLOURS = dict(zip(SCHEMES, ("tab:red", "tab:orange", "tab:green", "tab:purple", "tab:blue", "tab:cyan",
                             "tab:gray")))
SEQUENCES = [2 ** k for k in range(6, 21)]     # 64 to a million tokens


def models() -> list[str]:
    """The models the view offers: the lab's block and course.choosing's transformers."""
    return [LAB_BLOCK, *[name for name, model in choosing.MODELS.items() if model.heads]]


def check_settings(model: str, gpu: str, tp: int, context: int, measured) -> None:
    """Refuses, in words, settings the view cannot draw."""
    if model not in models():
        raise ValueError(f"model must be one of {models()}, got {model!r}")
    if gpu not in memory.GPUS:
        raise ValueError(f"gpu must be one of {list(memory.GPUS)}, got {gpu!r}")
    for name, value in (("tp", tp), ("context", context)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} counts ranks: at least 1, got {name}={value!r}")
    for kind, keys in (("held", {"sequence", "scheme", "bytes"}), ("sent", {"sequence", "bytes"})):
        for row in (measured or {}).get(kind, []):
            if not keys <= set(row) or row.get("scheme", "none") not in SCHEMES:
                raise ValueError(f"measured[{kind!r}] rows have the keys {', '.join(sorted(keys))}"
                                 f"{' (scheme one of ' + ', '.join(SCHEMES) + ')' if 'scheme' in keys else ''}; "
                                 f"got {row!r}")


def shape(model: str):
    """(h, a, layers, element bytes) of a preset of course.choosing, or of the lab's block."""
    if model == LAB_BLOCK:
        return 64, 4, 1, 4
    preset = choosing.MODELS[model]
    return preset.hidden, preset.heads, preset.layers, 2


def trained_with_dropout(model: str) -> bool:
    """Whether the model's layers keep dropout masks: the lab's block does (GPT-2's dropouts), a preset as
    `Model.dropout` says (GPT-3 yes, LLaMA-2 and Mixtral no)."""
    return model == LAB_BLOCK or choosing.MODELS[model].dropout


def kv_width(model: str) -> int:
    """The width of K and of V a token: the preset's `Model.kv_width` (grouped-query attention: LLaMA-2 70B
    and Mixtral 8 K/V heads), the lab's block's 64 (every head its own)."""
    return shape(model)[0] if model == LAB_BLOCK else choosing.MODELS[model].kv_width


def layer_bytes(scheme: str, s: int, model: str, tp: int, context: int) -> float:
    """One layer's activations per rank for one sequence of s tokens under `scheme`."""
    h, a, _, e = shape(model)
    common = dict(element_bytes=e, dropout=trained_with_dropout(model))
    kind = {"none": ("none", 1, False, 1), "selective": ("selective", 1, False, 1), "full": ("full", 1, False, 1),
            "tensor parallel": ("selective", tp, False, 1), "sequence parallel": ("selective", tp, True, 1),
            "context parallel": ("selective", 1, False, context),
            "sequence + context": ("selective", tp, True, context)}
    if scheme not in kind:
        raise ValueError(f"scheme must be one of {SCHEMES}, got {scheme!r}")
    recompute, t, sp, c = kind[scheme]
    return activations.layer_bytes(s, 1, h, a, t, recompute=recompute, sequence_parallel=sp, context=c, **common)


def sent_bytes(scheme: str, s: int, model: str, tp: int, context: int) -> float:
    """Bytes one rank sends per layer per step (forward and backward) under `scheme`."""
    h, _, _, e = shape(model)
    if scheme in ("tensor parallel", "sequence parallel"):
        return 4 * sizes.all_reduce_sent(s * h * e, tp)
    if scheme == "context parallel":
        return activations.ring_attention_sent(s, 1, h, context, element_bytes=e, kv_width=kv_width(model))
    if scheme == "context parallel, K and V all-gathered":
        return activations.all_gather_kv_sent(s, 1, h, context, element_bytes=e, kv_width=kv_width(model))
    if scheme == "context parallel, Ulysses":
        reason = why_not_ulysses(model, context)
        if reason:
            raise ValueError(f"Ulysses cannot run {model} on {context} context ranks: {reason}")
        return activations.ulysses_sent(s, 1, h, context, element_bytes=e, kv_width=kv_width(model))
    return 0.0


def why_not_ulysses(model: str, context: int) -> str | None:
    """Why Ulysses cannot split `model`'s heads over `context` ranks, or None: each rank takes heads/N whole
    heads of q and of K and V, so N divides the heads and the K/V heads (fewer K/V heads than ranks would
    have to be copied, which this count leaves out)."""
    h, a, _, _ = shape(model)
    groups = a * kv_width(model) // h                     # K/V heads
    if a % context or groups % context:
        return f"its {a} heads and {groups} K/V heads do not both split over {context} ranks"
    return None


def all_layers_bytes(scheme: str, s: int, model: str, tp: int, context: int) -> float:
    """Every layer's activations per rank at their peak: under "full" each layer's input, and the one layer
    backward is rebuilding, which keeps what a "none" layer keeps (course.activations' table)."""
    layers = shape(model)[2]
    rebuilt = layer_bytes("none", s, model, tp, context) if scheme == "full" else 0.0
    return layers * layer_bytes(scheme, s, model, tp, context) + rebuilt


def longest(scheme: str, model: str, gpu: str, tp: int, context: int) -> int:
    """The longest sequence (a power of two) whose activations, all layers, fit the GPU's memory."""
    budget = memory.GPUS[gpu].nbytes
    fits = [s for s in SEQUENCES if all_layers_bytes(scheme, s, model, tp, context) <= budget]
    return max(fits) if fits else 0


def draw(*, model: str = "GPT-3 175B", gpu: str = "NVIDIA H100 SXM (80 GB)", tp: int = 8, context: int = 4,
         measured=None) -> plt.Figure:
    check_settings(model, gpu, tp, context, measured)
    figure, (held, sent) = plt.subplots(1, 2, figsize=(12, 4.6), layout="constrained")
    for scheme in SCHEMES:
        held.plot(SEQUENCES, [layer_bytes(scheme, s, model, tp, context) for s in SEQUENCES],
                  color=COLOURS[scheme], label=scheme)
    held.axhline(memory.GPUS[gpu].nbytes / shape(model)[2], color="black", linestyle=":",
                 label=f"{gpu.split(' (')[0]} / {shape(model)[2]} layers")
    ulysses = why_not_ulysses(model, context)
    for scheme, label in (("sequence parallel", f"tensor or sequence parallel, t = {tp}"),
                          ("context parallel", f"ring attention, {context} ranks"),
                          ("context parallel, K and V all-gathered", "K and V all-gathered"),
                          ("context parallel, Ulysses", f"Ulysses: not drawn, {ulysses}" if ulysses else "Ulysses")):
        drawn = [] if scheme.endswith("Ulysses") and ulysses else SEQUENCES
        sent.plot(drawn, [sent_bytes(scheme, s, model, tp, context) for s in drawn],
                  color=COLOURS.get(scheme, "tab:olive" if scheme.endswith("Ulysses") else "tab:brown"), label=label)
    for row in (measured or {}).get("held", []):
        held.scatter([row["sequence"]], [row["bytes"]], color=COLOURS[row["scheme"]], edgecolor="black", zorder=3)
    for row in (measured or {}).get("sent", []):
        sent.scatter([row["sequence"]], [row["bytes"]], color=COLOURS["context parallel"], edgecolor="black",
                     zorder=3)
    for ax, title, ylabel in ((held, "activations per rank, one layer", "bytes"),
                              (sent, "sent per rank, one layer, one step", "bytes")):
        ax.set(xscale="log", yscale="log", xlabel="sequence length (tokens, one sequence)", ylabel=ylabel,
               title=title)
        ax.legend(fontsize="small")
    figure.suptitle(f"{model}: formula lines, this run's measurements as dots" if measured else model)
    return figure


def tokens(s: int) -> str:
    """A longest sequence in words: the view looks no further than SEQUENCES' last."""
    return "none" if not s else f"{s:,} or more" if s == SEQUENCES[-1] else f"{s:,}"


def describe(*, model: str, gpu: str, tp: int, context: int, **_) -> str:
    layers = shape(model)[2]
    fits = ", ".join(f"{scheme} {tokens(longest(scheme, model, gpu, tp, context))}" for scheme in SCHEMES)
    counted = f"{layers} layer{'s' if layers > 1 else ''}, nothing else counted"
    return (f"{model}: the longest sequence whose activations fit one {gpu} ({counted}), tp = {tp}, "
            f"context = {context}: {fits} tokens.")


def longest_table(*, model: str, gpu: str, tp: int, context: int) -> str:
    """A markdown table: each scheme's longest sequence that fits, and its bytes per layer at that length."""
    rows = ["| scheme | longest sequence that fits | activations per rank, all layers |", "|---|---:|---:|"]
    for scheme in SCHEMES:
        s = longest(scheme, model, gpu, tp, context)
        held = all_layers_bytes(scheme, s, model, tp, context) if s else 0
        rows.append(f"| {scheme} | {tokens(s)} | {held / 1e9:,.1f} GB |")
    return "\n".join(rows)


def show(measured=None, *, model: str = "GPT-3 175B", gpu: str = "NVIDIA H100 SXM (80 GB)", tp: int = 8,
         context: int = 4):
    """The view with its controls: model, GPU, tensor and context ranks; `measured` (the lab's block's run:
    {"held": [{sequence, scheme, bytes}], "sent": [{sequence, bytes}]}) drawn while the model and the context
    ranks are the run's."""
    import ipywidgets as w

    controls = {
        "model": w.Dropdown(options=models(), value=model, description="model", style=STYLE),
        "gpu": w.Dropdown(options=list(memory.GPUS), value=gpu, description="GPU", style=STYLE),
        "tp": int_slider(tp, low=1, high=8, description="tensor (and sequence) ranks"),
        "context": int_slider(context, low=1, high=32, description="context ranks"),
    }
    return show_view(draw, describe, controls, measured, {"model": model, "context": context})

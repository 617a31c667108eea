"""A rank's part of lab 9's GPT on a grid: its pipeline stage, its tensor-parallel slices, its sequence shard.

    stage = gpt_stage.Stage(gpt.GPT(config, seed), grid)     # every rank builds the whole model, keeps its part
    out = stage(x, positions)          # first stage: tokens (b, t_cp); else the hidden shard (b, t_cp/tp, w)
    # out: the hidden shard (b, t_cp/tp, w), or on the last stage the logits' vocabulary shard (b, t_cp, V/tp)
    gpt_stage.full_parameters(stage, grid)                   # the whole model again, on every rank

The split is Megatron-LM's, with sequence parallelism (Korthikanti et al. 2022) and context parallelism:
- pipeline (pp): stage p holds layers p·L/pp .. (`grid.layers(config)`), numbered from 0 on the stage
  (`blocks.{j}`, j local, as Megatron numbers them); the first stage the embeddings, the last ln_f and the
  output layer.
- tensor (tp), in each block: qkv and mlp.0 split by output features (qkv in whole heads: rank t holds heads
  t·H/tp ..), out and mlp.2 by input features; their partial outputs are summed over tp by a reduce-scatter
  along the sequence, so that between the split regions each tp rank holds 1/tp of the tokens (b, t_cp/tp, w)
  and runs the layer norms, biases of the row-split layers and residuals on those tokens only; a split
  region starts with an all-gather of the sequence. The token embedding and the tied output layer are split
  over the vocabulary (VocabParallelEmbedding): rank t holds rows t·V/tp ..; a token outside them embeds to
  0 and the partial embeddings are reduce-scattered; the logits stay split, (b, t_cp, V/tp).
- context (cp): rank c holds the contiguous chunk c of the sequence (t_cp = t/cp tokens); attention
  all-gathers K and V over cp and masks by global positions.
Each collective is an autograd Function whose backward is its adjoint: an all-gather's a reduce-scatter
(every rank's inputs feed different outputs), a reduce-scatter's an all-gather. gloo has no reduce-scatter
of its own: its `reduce_scatter_tensor` all-reduces, and the recorder says so.

Which gradients are whole after backward, and which are a rank's part (what exercise 5 reduces):
`split_over_tp(name)` parameters hold their own slice's gradient, whole over tp; the replicated ones (layer
norms, the row-split layers' biases, the position embedding) only their tokens' part, summed over tp;
`tied(name)` (the token embedding on the first stage and its copy `head.weight` on the last, pp > 1) summed
over the two; every one summed over dp × cp.

Used in: lab 9 (09_composition).
"""
from __future__ import annotations

import copy

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from course import context, gpt, sharding


def _all_gather(x: torch.Tensor, group, dim: int) -> torch.Tensor:
    """Every rank's `x`, joined along `dim` in the group's rank order."""
    ranks = dist.get_world_size(group)
    mine = x.movedim(dim, 0).contiguous()
    every = mine.new_empty((ranks * mine.shape[0], *mine.shape[1:]))
    sharding._library("all_gather_single", "all_gather_into_tensor")(every, mine, group=group)
    return every.movedim(0, dim).contiguous()


def _reduce_scatter(x: torch.Tensor, group, dim: int) -> torch.Tensor:
    """The sum over the group of `x`, this rank's block of it along `dim`."""
    ranks = dist.get_world_size(group)
    if x.shape[dim] % ranks:
        raise ValueError(f"rank {dist.get_rank()}: cannot reduce-scatter {x.shape[dim]} elements along dim {dim} "
                         f"over {ranks} ranks: they must divide evenly")
    every = x.movedim(dim, 0).contiguous()
    mine = every.new_empty((every.shape[0] // ranks, *every.shape[1:]))
    sharding._library("reduce_scatter_single", "reduce_scatter_tensor")(mine, every, group=group)
    return mine.movedim(0, dim).contiguous()


def _own_block(x: torch.Tensor, group, dim: int) -> torch.Tensor:
    """This rank's block of `x` along `dim`: what a computation every rank repeats gets back, nothing sent."""
    return x.chunk(dist.get_world_size(group), dim)[dist.get_rank(group)].contiguous()


class _Collective(torch.autograd.Function):
    """`forward(x, group, dim)` forward, `backward(grad, group, dim)` backward: a collective and its adjoint."""

    @staticmethod
    def forward(ctx, x, group, dim, forward, backward):
        ctx.group, ctx.dim, ctx.backward = group, dim, backward
        return forward(x, group, dim)

    @staticmethod
    def backward(ctx, grad):
        return ctx.backward(grad, ctx.group, ctx.dim), None, None, None, None

    @staticmethod
    def spmd_typecheck(*, x, group, dim, forward, backward):
        """Its local SPMD type, for spmd_types' checker (course.spmd_check), by what it does each way."""
        from spmd_types import I, R, S, V, rules

        pair = (forward.__name__, backward.__name__)
        if pair == ("_all_gather", "_reduce_scatter"):      # gather: a split region's input
            return rules.all_gather(x, group, src=S(dim), dst=R)
        if pair == ("_reduce_scatter", "_all_gather"):      # reduce_scatter: the partial sums out of it
            return rules.reduce_scatter(x, group, src=V, dst=S(dim))
        if pair == ("_all_gather", "_own_block"):           # gather_copies: a computation repeated alike
            return rules.all_gather(x, group, src=S(dim), dst=I)
        raise TypeError(f"no local SPMD type for a collective doing {pair}")


def gather(x: torch.Tensor, group, dim: int) -> torch.Tensor:
    """All-gather along `dim`, for a computation that differs by rank (a column-split layer, a cp rank's
    queries): backward reduce-scatters (sums every rank's gradient of this rank's block). Nothing sent on 1 rank."""
    return x if dist.get_world_size(group) == 1 else _Collective.apply(x, group, dim, _all_gather, _reduce_scatter)


def reduce_scatter(x: torch.Tensor, group, dim: int) -> torch.Tensor:
    """Sum partial results over the group, keep this rank's block along `dim`; backward all-gathers."""
    return x if dist.get_world_size(group) == 1 else _Collective.apply(x, group, dim, _reduce_scatter, _all_gather)


def gather_copies(x: torch.Tensor, group, dim: int) -> torch.Tensor:
    """All-gather along `dim` for a computation every rank repeats alike (a loss computed whole on each tp
    rank): backward keeps this rank's block of the gradient and sends nothing (Megatron's gather_from_...)."""
    return x if dist.get_world_size(group) == 1 else _Collective.apply(x, group, dim, _all_gather, _own_block)


def gathered_cross_entropy(logits: torch.Tensor, targets: torch.Tensor, group) -> torch.Tensor:
    """The naive stand-in for vocabulary-parallel cross-entropy: the logits' vocabulary shards all-gathered
    over `group` (the whole (b, t, V) on every rank), then `gpt.token_losses`; (b, t), 0 where IGNORE."""
    return gpt.token_losses(gather_copies(logits, group, -1), targets)


# Parameters split over tp, by local name's tail: the dimension of the split (0 by output features or
# vocabulary rows, 1 by input features).
_SPLIT = {"embedding.weight": 0, "head.weight": 0, "qkv.weight": 0, "qkv.bias": 0, "out.weight": 1,
          "mlp.0.weight": 0, "mlp.0.bias": 0, "mlp.2.weight": 1}


def check_layout(config: gpt.Config, sizes: dict) -> None:
    """Refuses, naming both numbers, a layout the model cannot take."""
    tp, pp, cp = (int(sizes.get(axis, 1)) for axis in ("tp", "pp", "cp"))
    for what, count, axis, by in (("heads", config.heads, "tp", tp), ("layers", config.layers, "pp", pp),
                                  ("vocabulary's tokens", config.vocab, "tp", tp),
                                  ("sequence's tokens", config.sequence, "cp × tp", cp * tp)):
        if by < 1 or count % by:
            raise ValueError(f"the model's {count} {what} do not split evenly over {axis} = {by}: "
                             f"choose a layout whose {axis} divides {count}")


def global_name(local: str, first_layer: int) -> str:
    """A stage's parameter name as GPT.named_parameters() names it: blocks numbered from `first_layer`,
    the last stage's tied copy `head.weight` is `embedding.weight`."""
    if local == "head.weight":
        return "embedding.weight"
    if local.startswith("blocks."):
        _, j, rest = local.split(".", 2)
        return f"blocks.{int(j) + first_layer}.{rest}"
    return local


def split_dim(name: str) -> int | None:
    """The dimension along which tp ranks hold different parts of the parameter `name` (local or global),
    or None where every tp rank holds it whole. As laid out, whatever the tp size (1 included)."""
    parts = name.split(".", 2)
    if parts[0] == "blocks" and len(parts) == 3 and parts[1].isdigit() and parts[2] in _block_shapes(1):
        return _SPLIT.get(parts[2])
    if name in ("embedding.weight", "position.weight", "head.weight", "ln_f.weight", "ln_f.bias"):
        return _SPLIT.get(name)
    raise ValueError(f"{name!r} is not a parameter of lab 9's GPT or of a stage of it")


def _block_shapes(w: int) -> dict[str, tuple[int, ...]]:
    """{name in a block: shape} in transformer.Block's order, for a width w."""
    return {"ln1.weight": (w,), "ln1.bias": (w,), "qkv.weight": (3 * w, w), "qkv.bias": (3 * w,),
            "out.weight": (w, w), "out.bias": (w,), "ln2.weight": (w,), "ln2.bias": (w,),
            "mlp.0.weight": (4 * w, w), "mlp.0.bias": (4 * w,), "mlp.2.weight": (w, 4 * w), "mlp.2.bias": (w,)}


def _rows(tensor: torch.Tensor, dim: int | None, part: int, parts: int) -> torch.Tensor:
    """Block `part` of `parts` of `tensor` along `dim` (the whole tensor where dim is None), a copy."""
    return tensor.detach().clone() if dim is None else tensor.detach().chunk(parts, dim)[part].clone()


class _Weight(nn.Module):
    def __init__(self, tensor: torch.Tensor):
        super().__init__()
        self.weight = nn.Parameter(tensor)


class _BlockPart(nn.Module):
    """A tp rank's part of one `transformer.Block`, with sequence parallelism between its split regions."""

    def __init__(self, block, tp: int, t: int):
        super().__init__()
        self.head_dim = block.head_dim
        self.ln1, self.qkv, self.out = copy.deepcopy(block.ln1), nn.Module(), nn.Module()    # the block's order
        self.ln2, self.mlp = copy.deepcopy(block.ln2), nn.Sequential(nn.Module(), nn.GELU(), nn.Module())
        names = {"qkv": block.qkv, "out": block.out, "mlp.0": block.mlp[0], "mlp.2": block.mlp[2]}
        part = {f"{name}.{kind}": nn.Parameter(_rows(getattr(layer, kind), _SPLIT.get(f"{name}.{kind}"), t, tp))
                for name, layer in names.items() for kind in ("weight", "bias")}
        for name, parameter in part.items():
            module, kind = name.rsplit(".", 1)
            self.get_submodule(module).register_parameter(kind, parameter)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, keys: torch.Tensor, tp, cp) -> torch.Tensor:
        qkv = F.linear(gather(self.ln1(x), tp, 1), self.qkv.weight, self.qkv.bias)      # (b, t_cp, 3w/tp)
        b, t, features = qkv.shape
        heads = features // (3 * self.head_dim)
        qkv = qkv.view(b, t, heads, 3, self.head_dim)
        kv = gather(qkv[:, :, :, 1:], cp, 1)                                    # every cp rank's K and V
        q, k, v = (part.movedim(1, 2) for part in (qkv[:, :, :, 0], kv[:, :, :, 0], kv[:, :, :, 1]))
        mixed, _ = context.attention(q, k, v, causal=True, query_positions=positions, key_positions=keys)
        mixed = mixed.movedim(1, 2).reshape(b, t, heads * self.head_dim)
        x = x + reduce_scatter(F.linear(mixed, self.out.weight), tp, 1) + self.out.bias
        h = self.mlp[1](F.linear(gather(self.ln2(x), tp, 1), self.mlp[0].weight, self.mlp[0].bias))   # GELU
        return x + reduce_scatter(F.linear(h, self.mlp[2].weight), tp, 1) + self.mlp[2].bias


class Stage(nn.Module):
    """This rank's part of `model` on `grid` (a `course.mesh.Grid`): copies of its slices, parameters of
    its own, named as Megatron names a stage's (see the module's docstring)."""

    def __init__(self, model: gpt.GPT, grid):
        super().__init__()
        config = model.config
        check_layout(config, grid.sizes)
        self.config, self.grid = config, grid
        tp, t = grid.sizes["tp"], grid.coords["tp"]
        self.tp_size, self.tp_rank, self.cp_size, self.cp_rank = tp, t, grid.sizes["cp"], grid.coords["cp"]
        self.layer_range = grid.layers(config)
        self.first_layer = self.layer_range.start
        self.first_stage, self.last_stage, self.pipelined = grid.first_stage, grid.last_stage, grid.sizes["pp"] > 1
        if self.first_stage:
            self.embedding = _Weight(_rows(model.embedding.weight, 0, t, tp))
            self.position = _Weight(model.position.weight.detach().clone())
        self.blocks = nn.ModuleList(_BlockPart(model.blocks[i], tp, t) for i in self.layer_range)
        if self.last_stage:
            self.ln_f = copy.deepcopy(model.ln_f)
            if self.pipelined:
                self.head = _Weight(_rows(model.embedding.weight, 0, t, tp))

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        tp, cp = self.grid.groups["tp"], self.grid.groups["cp"]
        positions = torch.as_tensor(positions).to(device=x.device)
        t_cp = len(positions)
        if t_cp % self.tp_size:
            raise ValueError(f"rank {self.grid.rank}: {t_cp} positions do not split over tp = {self.tp_size} "
                             "ranks: give each cp rank a chunk of the sequence that tp divides")
        start = int(positions[0]) - self.cp_rank * t_cp          # the chunks are contiguous, in cp order
        keys = torch.arange(start, start + self.cp_size * t_cp, device=x.device)
        if not torch.equal(positions, keys[self.cp_rank * t_cp:(self.cp_rank + 1) * t_cp]):
            raise ValueError(f"rank {self.grid.rank}: positions {positions.tolist()} are not contiguous chunk "
                             f"{self.cp_rank} of {self.cp_size} of the sequence: give cp rank c the c-th block "
                             "of context.contiguous_positions")
        mine = positions.chunk(self.tp_size)[self.tp_rank]       # this tp rank's tokens of the chunk
        if self.first_stage and (x.dim() != 2 or x.shape[1] != t_cp or x.is_floating_point()):
            raise ValueError(f"rank {self.grid.rank}: the first stage takes tokens (batch, {t_cp}) for {t_cp} "
                             f"positions, got a {x.dtype} tensor of shape {tuple(x.shape)}")
        if not self.first_stage and (x.dim() != 3 or x.shape[1:] != (len(mine), self.config.width)):
            raise ValueError(f"rank {self.grid.rank}: stage input of shape {tuple(x.shape)}, expected the "
                             f"hidden shard (batch, {len(mine)}, {self.config.width}) for {t_cp} positions")
        if self.first_stage:
            x = reduce_scatter(self._embed(x), tp, 1) + self.position.weight[mine]
        for block in self.blocks:
            x = block(x, positions, keys, tp, cp)
        if not self.last_stage:
            return x
        output = self.head.weight if self.pipelined else self.embedding.weight
        return gather(self.ln_f(x), tp, 1) @ output.T              # (b, t_cp, V/tp)

    def _embed(self, tokens: torch.Tensor) -> torch.Tensor:
        """Megatron's VocabParallelEmbedding before its sum: rows of this rank's vocabulary, 0 elsewhere."""
        rows = self.embedding.weight.shape[0]
        start = self.tp_rank * rows
        inside = (tokens >= start) & (tokens < start + rows)
        embedded = F.embedding(torch.where(inside, tokens - start, torch.zeros_like(tokens)), self.embedding.weight)
        return embedded * inside[..., None]

    def global_name(self, local: str) -> str:
        """The model's name for this stage's parameter `local`."""
        return global_name(local, self.first_layer)

    def split_over_tp(self, name: str) -> bool:
        """Whether each tp rank holds a different part of this stage's parameter `name` (local)."""
        return split_dim(self._own(name)) is not None

    def tied(self, name: str) -> bool:
        """Whether this parameter's gradient is summed with another stage's copy (the embedding group)."""
        return self.pipelined and self._own(name) in ("embedding.weight", "head.weight")

    def _own(self, name: str) -> str:
        if name not in dict(self.named_parameters()):
            raise ValueError(f"rank {self.grid.rank} ({self.grid.describe()}) holds no parameter {name!r}; "
                             f"its parameters: {', '.join(n for n, _ in self.named_parameters())}")
        return name


def global_shapes(config: gpt.Config) -> dict[str, tuple[int, ...]]:
    """{name: shape} of every parameter of GPT(config), in GPT.named_parameters() order."""
    w = config.width
    shapes = {"embedding.weight": (config.vocab, w), "position.weight": (config.sequence, w)}
    for layer in range(config.layers):
        shapes.update({f"blocks.{layer}.{name}": shape for name, shape in _block_shapes(w).items()})
    return shapes | {"ln_f.weight": (w,), "ln_f.bias": (w,)}


def stage_names(config: gpt.Config, stage: int, stages: int) -> list[str]:
    """The global names of the parameters pipeline stage `stage` of `stages` holds (its tied copy left out)."""
    per_stage = config.layers // stages
    layers = range(stage * per_stage, (stage + 1) * per_stage)
    return [name for name in global_shapes(config)
            if (name.startswith("blocks.") and int(name.split(".")[1]) in layers)
            or (stage == 0 and name in ("embedding.weight", "position.weight"))
            or (stage == stages - 1 and name.startswith("ln_f."))]


@torch.no_grad()
def full_parameters(stage: Stage, grid, *, grads: bool = False) -> dict[str, torch.Tensor]:
    """{global name: the whole tensor} of the whole model on every rank: each parameter gathered over tp
    along its split, then every stage's broadcast over pp (the first stage's embedding, not the last's
    copy). With `grads`, their gradients as this rank holds them (0 where none): before exercise 5's
    reductions, a replicated parameter's is this tp rank's part only."""
    mine = {}
    for name, parameter in stage.named_parameters():
        if name == "head.weight":
            continue
        value = (parameter if not grads or parameter.grad is None else parameter.grad).detach()
        value = torch.zeros_like(value) if grads and parameter.grad is None else value
        dim = split_dim(name)
        mine[stage.global_name(name)] = value.clone() if dim is None or stage.tp_size == 1 \
            else _all_gather(value, grid.groups["tp"], dim)
    shapes, stages = global_shapes(stage.config), grid.sizes["pp"]
    if stages == 1:
        return {name: mine[name] for name in shapes}
    every = {}
    for p, source in enumerate(grid.ranks["pp"]):
        names = stage_names(stage.config, p, stages)
        lengths = [torch.Size(shapes[name]).numel() for name in names]
        if p == grid.coords["pp"]:
            flat = torch.cat([mine[name].reshape(-1) for name in names])
        else:
            flat = next(iter(mine.values())).new_empty(sum(lengths))
        dist.broadcast(flat, source, group=grid.groups["pp"])
        every.update({name: piece.view(shapes[name]) for name, piece in zip(names, flat.split(lengths))})
    return {name: every[name] for name in shapes}


def slice_of(stage: Stage, grid, full: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """{local name: this rank's slice} of `full` ({global name: a whole tensor}, the model's gradients say),
    for every parameter of `stage`: copies, cut as the stage cut its parameters."""
    out = {}
    for name, _ in stage.named_parameters():
        whole = full.get(stage.global_name(name))
        if whole is None:
            raise ValueError(f"rank {grid.rank}: no {stage.global_name(name)!r} in the full tensors given, "
                             f"which stage parameter {name!r} is a slice of")
        out[name] = _rows(whole, split_dim(name), stage.tp_rank, stage.tp_size)
    return out

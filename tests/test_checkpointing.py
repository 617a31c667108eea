"""Covers: course.checkpointing.

torch.utils.checkpoint's two forms and op-level selective checkpointing on lab 3's block with dropout: the
same gradients as no recomputation, the bytes each forward keeps (the op-level policy's exactly: its weight
matmuls' outputs), the reentrant form's trap on an input that requires no gradient, and a student's
recomputation that forgets the generator's state or recomputes nothing, caught."""
from __future__ import annotations

import pytest
import torch
from torch.utils.checkpoint import checkpoint

from course import checkpointing, transformer

WIDTH, HEADS, BATCH, TOKENS = 32, 4, 2, 24
TOLERANCE = dict(rtol=1e-4, atol=1e-5)


def make_block():
    return transformer.Block(WIDTH, HEADS, seed=3, dropout=0.3).train()


def torch_reentrant(run, x):
    """A correct student's answer: torch's own reentrant form."""
    return checkpoint(run, x, use_reentrant=True)


def forgets_the_generator(run, x):
    """Recomputes without putting the generator's state back: other dropout masks in backward."""
    class Forgetful(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return run(x)

        @staticmethod
        def backward(ctx, grad):
            (x,) = ctx.saved_tensors
            x = x.detach().requires_grad_()
            with torch.enable_grad():
                torch.autograd.backward(run(x), grad)
            return x.grad
    return Forgetful.apply(x)


@pytest.fixture(scope="module")
def rows():
    x = torch.randn(BATCH, TOKENS, WIDTH, generator=torch.Generator().manual_seed(0))
    return {row["scheme"]: row for row in checkpointing.compare(
        make_block, checkpointing.forwards(torch_reentrant), x, seed=5, repeats=1, **TOLERANCE)}


def test_every_scheme_gives_the_gradients_of_no_recomputation(rows):
    assert all(row["gradients as none's"] for row in rows.values()), rows


def test_recomputing_the_whole_block_keeps_nothing_but_the_output(rows):
    output = BATCH * TOKENS * WIDTH * 4
    for scheme in (checkpointing.YOURS, checkpointing.REENTRANT, checkpointing.NON_REENTRANT):
        assert rows[scheme]["bytes kept after the forward"] == rows[scheme]["of them the output"] == output
    assert rows[checkpointing.NONE]["bytes kept after the forward"] > 10 * output


@pytest.mark.skipif(not checkpointing.op_level_available(), reason=checkpointing.op_level_missing())
def test_the_op_level_policy_keeps_the_weight_matmuls_outputs_and_nothing_else(rows):
    # qkv (3h), the output projection (h), the MLP's two layers (4h, h): 9h floats a token, and the output
    matmuls = 9 * WIDTH * BATCH * TOKENS * 4
    assert rows[checkpointing.OP_LEVEL]["bytes kept after the forward"] == matmuls + BATCH * TOKENS * WIDTH * 4


def test_the_reentrant_form_leaves_the_parameters_without_gradients_when_the_input_needs_none(rows):
    parameters = len(list(make_block().parameters()))
    assert rows[checkpointing.YOURS]["parameters with a gradient, data input"] == f"0 of {parameters}"
    assert rows[checkpointing.REENTRANT]["parameters with a gradient, data input"] == f"0 of {parameters}"
    assert rows[checkpointing.NON_REENTRANT]["parameters with a gradient, data input"] == \
        f"{parameters} of {parameters}"
    x = torch.randn(BATCH, TOKENS, WIDTH)
    _, _, warned = checkpointing.parameters_with_gradient(
        make_block, checkpointing.forwards(torch_reentrant)[checkpointing.REENTRANT], x)
    assert any("requires_grad=True" in warning for warning in warned), warned


def test_a_recomputation_that_forgets_the_generator_s_state_is_caught():
    x = torch.randn(BATCH, TOKENS, WIDTH, generator=torch.Generator().manual_seed(1))
    row, = [r for r in checkpointing.compare(make_block, checkpointing.forwards(forgets_the_generator), x,
                                             seed=5, repeats=1, **TOLERANCE) if r["scheme"] == checkpointing.YOURS]
    assert not row["gradients as none's"]


def test_a_recomputation_that_recomputes_nothing_keeps_what_the_plain_block_keeps():
    x = torch.randn(BATCH, TOKENS, WIDTH)
    plain, _, _ = checkpointing.step(make_block, lambda model, x: model(x), x, 0)
    lazy, _, _ = checkpointing.step(make_block, checkpointing.forwards(lambda run, x: run(x))[checkpointing.YOURS],
                                    x, 0)
    assert lazy == plain


def test_saved_bytes_sees_only_what_torch_s_checkpoint_hands_its_hooks():
    def saved_bytes(run, exclude=()):
        kept = {}

        def pack(tensor):
            kept[tensor.untyped_storage().data_ptr()] = tensor.untyped_storage().nbytes()
            return tensor
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            run()
        excluded = {t.untyped_storage().data_ptr() for t in exclude}
        return sum(n for pointer, n in kept.items() if pointer not in excluded)

    x = torch.randn(BATCH, TOKENS, WIDTH)
    found = {row["scheme"]: row for row in checkpointing.compare(
        make_block, checkpointing.forwards(torch_reentrant), x, repeats=1, saved_bytes=saved_bytes, **TOLERANCE)}
    assert found[checkpointing.NONE]["saved_bytes sees"] > 10 * x.nbytes
    assert found[checkpointing.NON_REENTRANT]["saved_bytes sees"] == x.nbytes     # the input, nothing inside
    if checkpointing.op_level_available():
        # the kept matmul outputs are in the checkpoint's own cache, which the outer hooks never see
        assert found[checkpointing.OP_LEVEL]["saved_bytes sees"] < found[checkpointing.OP_LEVEL][
            "bytes kept after the forward"]


def test_without_the_op_level_api_its_row_is_left_out_and_says_which_torch(monkeypatch):
    monkeypatch.delattr(torch.utils.checkpoint, "create_selective_checkpoint_contexts")
    assert checkpointing.OP_LEVEL not in checkpointing.forwards(torch_reentrant)
    assert "torch 2.4 or newer" in checkpointing.op_level_missing()


def test_wrong_arguments_are_refused_in_words():
    with pytest.raises(ValueError, match="needs your recomputed"):
        checkpointing.forwards(None)
    with pytest.raises(ValueError, match="needs the scheme 'none'"):
        checkpointing.compare(make_block, {"yours": lambda model, x: model(x)}, torch.randn(1, 4, WIDTH))
    with pytest.raises(ValueError, match="at least one repeat"):
        checkpointing.median_seconds(make_block, lambda model, x: model(x), torch.randn(1, 4, WIDTH), repeats=0)


def test_the_timing_runs_on_one_thread_and_puts_torch_s_count_back():
    threads = torch.get_num_threads()
    seen = []

    def forward(model, x):
        seen.append(torch.get_num_threads())
        return model(x)
    try:
        torch.set_num_threads(2)
        assert checkpointing.median_seconds(make_block, forward, torch.randn(1, 4, WIDTH), repeats=3) > 0
        assert seen == [1, 1, 1] and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(threads)

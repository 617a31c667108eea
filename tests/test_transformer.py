"""Covers: course.transformer.

course.transformer: the block lab 3 splits as Megatron-LM does, and what the split sends.

Attention is checked against PyTorch's own (scaled_dot_product_attention, causal) on
the head-by-head [q, k, v] layout, whole and for a rank's slice of whole heads; the
parameter and byte formulas against counts by hand.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from course import transformer

BATCH, SEQUENCE, HEADS, HEAD_DIM = 2, 5, 4, 8


def _heads_qkv(seed: int = 0):
    """q, k, v as (batch, heads, sequence, head_dim), and the same numbers laid out as the block's qkv:
    (batch, sequence, heads × 3 × head_dim), [q, k, v] of head 0, then of head 1, ..."""
    generator = torch.Generator().manual_seed(seed)
    q, k, v = torch.randn(3, BATCH, HEADS, SEQUENCE, HEAD_DIM, generator=generator, dtype=torch.float64)
    by_head = torch.stack([q, k, v], dim=3)                           # (batch, heads, sequence, 3, head_dim)
    qkv = by_head.permute(0, 2, 1, 3, 4).reshape(BATCH, SEQUENCE, HEADS * 3 * HEAD_DIM)
    return q, k, v, qkv


def _torch_attention(q, k, v):
    """PyTorch's causal attention, heads laid side by side: (batch, sequence, heads × head_dim)."""
    mixed = F.scaled_dot_product_attention(q, k, v, is_causal=True)   # (batch, heads, sequence, head_dim)
    return mixed.transpose(1, 2).reshape(BATCH, SEQUENCE, -1)


def test_attention_is_pytorchs_causal_attention_on_the_head_by_head_layout():
    q, k, v, qkv = _heads_qkv()
    assert torch.allclose(transformer.attention(qkv, HEAD_DIM), _torch_attention(q, k, v))


@pytest.mark.parametrize("first, last", [(0, 2), (2, 4), (1, 2)])
def test_attention_on_a_slice_of_whole_heads_is_those_heads_of_the_whole(first, last):
    q, k, v, qkv = _heads_qkv(seed=1)
    rank_share = qkv[..., first * 3 * HEAD_DIM:last * 3 * HEAD_DIM]       # a column split's share
    expected = _torch_attention(q, k, v)[..., first * HEAD_DIM:last * HEAD_DIM]
    assert torch.allclose(transformer.attention(rank_share, HEAD_DIM), expected)


def test_the_shares_of_the_head_owners_put_together_are_the_whole_attention():
    _, _, _, qkv = _heads_qkv(seed=2)
    shares = [transformer.attention(qkv[..., owned.start * 3 * HEAD_DIM:owned.stop * 3 * HEAD_DIM], HEAD_DIM)
              for owned in transformer.head_owners(HEADS, 2)]
    assert torch.allclose(torch.cat(shares, dim=-1), transformer.attention(qkv, HEAD_DIM))


def test_attention_refuses_a_slice_that_cuts_a_head():
    _, _, _, qkv = _heads_qkv()
    with pytest.raises(ValueError, match="not a whole number of heads of 3 × 8: split the heads"):
        transformer.attention(qkv[..., :2 * 3 * HEAD_DIM - HEAD_DIM], HEAD_DIM)   # q and k of head 1, no v


def test_block_parameters_are_the_blocks_counted_by_hand():
    block = transformer.Block(width=64, heads=8)
    counted = sum(p.numel() for p in block.parameters())
    # qkv 64 × 192 + 192, out 64 × 64 + 64, MLP 64 × 256 + 256 and 256 × 64 + 64, two layer norms 2 × (64 + 64):
    # 12 w² + 13 w
    assert counted == transformer.block_parameters(64) == 12 * 64 * 64 + 13 * 64 == 49_984
    assert sum(p.numel() for p in transformer.Block(width=96, heads=3).parameters()) \
        == transformer.block_parameters(96)


def test_block_refuses_heads_that_do_not_divide_the_width():
    with pytest.raises(ValueError, match="a width of 64 does not split into 6 heads"):
        transformer.Block(width=64, heads=6)


def test_block_output_keeps_the_shape_and_depends_only_on_earlier_tokens():
    block = transformer.Block(width=32, heads=4, seed=3)
    x = torch.randn(2, 6, 32)
    y = block(x)
    later_changed = x.clone()
    later_changed[:, 4:] += 1.0
    assert y.shape == x.shape
    assert torch.allclose(block(later_changed)[:, :4], y[:, :4])     # causal: tokens 0-3 never see 4-5


def test_head_owners_give_each_rank_a_block_of_whole_heads():
    assert transformer.head_owners(8, 2) == [range(0, 4), range(4, 8)]
    assert transformer.head_owners(12, 4) == [range(0, 3), range(3, 6), range(6, 9), range(9, 12)]
    with pytest.raises(ValueError, match="8 heads do not split evenly over 3 ranks"):
        transformer.head_owners(8, 3)


def test_bytes_sent_by_hand():
    # batch 2, sequence 16, width 64, float32: the activation is 2 × 16 × 64 × 4 = 8,192 bytes; a ring all-reduce
    # sends 2(N-1)/N of it: 1 × on 2 ranks, 1.5 × on 4; the split does four of them
    assert transformer.split_block_sent(2, 16, 64, 2) == 4 * 8_192 == 32_768
    assert transformer.split_block_sent(2, 16, 64, 4) == 4 * 12_288 == 49_152
    assert transformer.split_block_sent(2, 16, 64, 2, "bfloat16") == 16_384
    # data parallelism all-reduces the 49,984 parameters' gradients once: 199,936 bytes in float32
    assert transformer.data_parallel_block_sent(64, 2) == 199_936
    assert transformer.data_parallel_block_sent(64, 4) == 299_904


@pytest.mark.parametrize("width, ranks", [(64, 2), (512, 4), (1024, 8)])
def test_crossover_tokens_is_where_the_two_send_the_same(width, ranks):
    tokens = transformer.crossover_tokens(width)
    assert tokens == pytest.approx(3 * width + 13 / 4)                     # (12 w² + 13 w) / 4 w
    # the split's bytes are proportional to the tokens (batch × sequence)
    split_per_token = transformer.split_block_sent(1, 1, width, ranks)
    assert tokens * split_per_token == pytest.approx(transformer.data_parallel_block_sent(width, ranks))
    below, above = int(tokens), int(tokens) + 1
    assert transformer.split_block_sent(1, below, width, ranks) < transformer.data_parallel_block_sent(width, ranks)
    assert transformer.split_block_sent(1, above, width, ranks) > transformer.data_parallel_block_sent(width, ranks)


def test_training_flop_by_hand():
    # forward: 2 flop × 32 tokens × 12 × 64² weights = 3,145,728, and q·k and scores·v, 2 × 16² × 64 = 32,768
    # multiply-adds each: 2 flop × 2 × 32,768 = 131,072; backward twice the forward
    assert transformer.training_flop(2, 16, 64) == 3 * (3_145_728 + 131_072) == 9_830_400


def test_all_reduces_per_step_are_four_per_layer_and_micro_batch_for_the_split_one_for_data_parallelism():
    assert transformer.all_reduces_per_step(1, 1) == {"Megatron split": 4, "data parallel": 1}
    # GPT-3 175B's 96 layers, 8 micro-batches a step: 3,072 blocking all-reduces against one
    assert transformer.all_reduces_per_step(96, 8) == {"Megatron split": 3_072, "data parallel": 1}
    with pytest.raises(ValueError, match="at least one layer and one micro-batch, got 2 layers and 0"):
        transformer.all_reduces_per_step(2, 0)


def test_replicas_for_the_split_to_send_less_is_where_each_groups_tokens_reach_the_crossover():
    # width 64: crossover (12 · 64² + 13 · 64) / (4 · 64) = 195.25 tokens; 19,525 tokens a step: 100 groups
    assert transformer.replicas_for_split_to_send_less(64, 19_525) == pytest.approx(100)
    replicas = transformer.replicas_for_split_to_send_less(512, 1_000_000)
    tokens_per_group = 1_000_000 / (0.9 * replicas)              # fewer groups: more tokens each
    gradients = transformer.data_parallel_block_sent(512, 2)
    assert transformer.split_block_sent(1, round(tokens_per_group), 512, 2) > gradients
    tokens_per_group = 1_000_000 / (1.1 * replicas)              # more groups: fewer tokens each
    assert transformer.split_block_sent(1, round(tokens_per_group), 512, 2) < gradients
    with pytest.raises(ValueError, match="at least one token, got 0"):
        transformer.replicas_for_split_to_send_less(64, 0)

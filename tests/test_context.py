"""Covers: course.context, course.activations.

course.context: the splits of a sequence over ranks, the masks (causal, none, packed documents), one
process's attention with its log-sum-exp under any of them, the causal work per rank, and the tokens a rank
from which the ring's steps hide; and course.activations' long-sequence formulas (element size, dropout,
context parallelism, the ring's and Ulysses' bytes), checked by hand."""
from __future__ import annotations

import math

import pytest
import torch

from course import activations, context


def test_a_contiguous_split_gives_the_first_ranks_one_token_more():
    assert [p.tolist() for p in context.contiguous_positions(10, 3)] == [[0, 1, 2, 3], [4, 5, 6], [7, 8, 9]]
    with pytest.raises(ValueError, match="cannot give each of 4 ranks a token"):
        context.contiguous_positions(3, 4)


def test_a_split_must_hold_every_position_once():
    context.check_split([torch.tensor([0, 3]), torch.tensor([1, 2])], 4)
    with pytest.raises(ValueError, match=r"missing \[2\]"):
        context.check_split([torch.tensor([0, 3]), torch.tensor([1, 1])], 4)


def test_one_process_attention_is_the_softmax_of_the_scaled_scores_and_its_log_sum_exp():
    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 5, 4, generator=generator, dtype=torch.float64) for _ in range(3))
    out, lse = context.attention(q, k, v, causal=True)
    scores = q @ k.transpose(-1, -2) / 2.0                          # √4
    scores = scores.masked_fill(torch.ones(5, 5, dtype=torch.bool).triu(1), -math.inf)
    torch.testing.assert_close(out, scores.softmax(-1) @ v)
    torch.testing.assert_close(lse, scores.logsumexp(-1))
    # a rank's queries at positions 3 and 4 against the keys at 0..4: the last two rows of the whole
    part, part_lse = context.attention(q[:, :, 3:], k, v, True, torch.tensor([3, 4]), torch.arange(5))
    torch.testing.assert_close(part, out[:, :, 3:])
    torch.testing.assert_close(part_lse, lse[:, :, 3:])


def test_causal_pairs_count_each_query_s_keys_at_or_before_it():
    # 4 tokens on 2 ranks: rank 0 holds 0, 1 (1 + 2 pairs), rank 1 holds 2, 3 (3 + 4)
    assert context.causal_pairs(context.contiguous_positions(4, 2)) == [3, 7]
    assert context.imbalance(context.contiguous_positions(4, 2)) == pytest.approx(7 / 5)
    # zig-zag by hand: rank 0 holds 0 and 3 (1 + 4), rank 1 holds 1 and 2 (2 + 3)
    assert context.causal_pairs([torch.tensor([0, 3]), torch.tensor([1, 2])]) == [5, 5]
    # contiguous on N ranks: the busiest about (2N - 1)/N of the mean
    assert context.imbalance(context.contiguous_positions(4096, 8)) == pytest.approx(15 / 8, rel=1e-3)


def test_layer_bytes_in_the_course_s_dtypes():
    s, b, h, a = 512, 2, 64, 4
    sbh = s * b * h
    assert activations.layer_bytes(s, b, h, a, recompute="none") == sbh * (34 + 5 * a * s / h)   # the paper's
    # float32, 1-byte masks: 16e + 2 a token and feature, the scores (2e + 1)·as/h
    assert activations.layer_bytes(s, b, h, a, recompute="none", element_bytes=4) == sbh * (66 + 9 * a * s / h)
    # no dropout: no masks, and the softmax's output is the matmul's input (one storage): e·as/h
    assert activations.layer_bytes(s, b, h, a, recompute="none", element_bytes=4, dropout=False) == \
        sbh * (64 + 4 * a * s / h)
    assert activations.layer_bytes(s, b, h, a, recompute="full", element_bytes=4) == 4 * sbh
    # context parallelism over 4 ranks: every per-token term a quarter, the scores a·(s/4)·s
    assert activations.layer_bytes(s, b, h, a, recompute="none", context=4) == sbh / 4 * (34 + 5 * a * s / h)
    assert activations.layer_bytes(s, b, h, a, 8, recompute="selective", sequence_parallel=True, context=4) == \
        sbh * 34 / 32
    with pytest.raises(ValueError, match="at least 1 each"):
        activations.layer_bytes(s, b, h, a, recompute="none", context=0)


def test_ring_attention_sends_each_block_on_and_its_gradients_home():
    # 1024 tokens, 64 features of K and of V, 4 ranks, float32: a block of K and V is 2·256·64·4 = 131,072 bytes
    block = 2 * 256 * 64 * 4
    assert activations.ring_attention_sent(1024, 1, 64, 4, backward=False) == 3 * block
    assert activations.ring_attention_sent(1024, 1, 64, 4) == 3 * block + 3 * block + 4 * block
    assert activations.ring_attention_sent(1024, 1, 64, 1) == 0
    # all-gathered: (N - 1)/N of the whole K and V, and the same again to reduce-scatter their gradients
    assert activations.all_gather_kv_sent(1024, 1, 64, 4) == 2 * 3 / 4 * (2 * 1024 * 64 * 4)


def test_a_document_mask_keeps_each_query_to_its_own_document_and_causal():
    mask = context.document_mask([0, 3, 5])
    hidden = mask(torch.arange(7), torch.arange(7))
    allowed = [row.nonzero().flatten().tolist() for row in ~hidden]
    assert allowed == [[0], [0, 1], [0, 1, 2], [3], [3, 4], [5], [5, 6]]
    assert not context.no_mask(torch.arange(3), torch.arange(4)).any()
    # By positions, wherever the tokens are held: rank-local indices would give another answer.
    assert mask(torch.tensor([4]), torch.tensor([6, 3, 2])).tolist() == [[True, False, True]]
    for starts in ([1, 4], [0, 4, 4], []):
        with pytest.raises(ValueError, match="increasing positions beginning with 0"):
            context.document_mask(starts)


def test_one_process_attention_under_a_mask_is_the_softmax_over_the_keys_it_leaves():
    generator = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, 6, 4, generator=generator, dtype=torch.float64) for _ in range(3))
    mask = context.document_mask([0, 2])
    out, lse = context.attention(q, k, v, mask=mask)
    for i in range(6):
        keys = [j for j in range(6) if not mask(torch.tensor([i]), torch.tensor([j]))[0, 0]]
        scores = q[..., i:i + 1, :] @ k[..., keys, :].transpose(-1, -2) / 2
        torch.testing.assert_close(lse[..., i:i + 1], scores.logsumexp(-1))
        torch.testing.assert_close(out[..., i:i + 1, :], scores.softmax(-1) @ v[..., keys, :])
    causal, _ = context.attention(q, k, v, causal=True)
    torch.testing.assert_close(context.attention(q, k, v, mask=context.causal_mask)[0], causal)
    assert not torch.allclose(out, causal)


def test_the_ring_hides_its_steps_past_peak_flops_over_link_bandwidth_tokens():
    # H100 SXM's dense BF16 over NVLink 4's 450 GB/s a direction: K and V as wide as h at 16 bits.
    assert context.ring_hiding_tokens(989.5e12, 450e9, h=8192) == pytest.approx(989.5e12 / 450e9)
    # LLaMA-2 70B's 8 K/V heads of 64: an eighth of the bytes, an eighth of the tokens; causal halves the compute.
    assert context.ring_hiding_tokens(989.5e12, 450e9, h=8192, kv_width=1024) == pytest.approx(989.5e12 / 450e9 / 8)
    assert context.ring_hiding_tokens(989.5e12, 50e9, h=8192, causal=True) == pytest.approx(2 * 989.5e12 / 50e9)
    with pytest.raises(ValueError, match="kv_width from 1 to h"):
        context.ring_hiding_tokens(1e12, 1e9, h=64, kv_width=128)


def test_ulysses_sends_its_tokens_q_k_v_and_output_once_each_way_whatever_the_ranks():
    # Each rank keeps 1/N of its s/N tokens' q, K, V and output and sends the rest: (N − 1)/N² · s · (2h + 2kv).
    assert activations.ulysses_sent(1024, 1, 64, 2, backward=False) == 1 / 4 * 1024 * (2 * 64 + 2 * 64) * 4
    assert activations.ulysses_sent(1024, 1, 64, 2) == 2 * activations.ulysses_sent(1024, 1, 64, 2, backward=False)
    assert activations.ulysses_sent(1024, 1, 64, 4, kv_width=16) == 2 * 3 / 16 * 1024 * (128 + 32) * 4
    # The ring's bytes stay (N − 1)/N of K and V forward whatever N; Ulysses' a rank fall as 1/N.
    assert activations.ulysses_sent(2 ** 17, 1, 8192, 16) < activations.ring_attention_sent(2 ** 17, 1, 8192, 16) / 8
    with pytest.raises(ValueError, match="at least 1 rank"):
        activations.ulysses_sent(16, 1, 64, 0)

"""Covers: course.gpt."""
import math

import pytest
import torch

from course import gpt

SMALL = gpt.Config(vocab=32, width=16, heads=2, layers=2, sequence=8)


def test_the_same_seed_builds_the_same_weights_and_leaves_the_callers_random_state():
    torch.manual_seed(5)
    before = torch.rand(1)
    torch.manual_seed(5)
    a, b = gpt.GPT(SMALL, seed=3), gpt.GPT(SMALL, seed=3)
    assert torch.rand(1) == before
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    assert not torch.equal(gpt.GPT(SMALL, seed=4).embedding.weight, a.embedding.weight)


def test_the_output_layer_is_the_token_embedding():
    model = gpt.GPT(SMALL)
    names = [name for name, _ in model.named_parameters()]
    assert "embedding.weight" in names and not any("head" in n for n in names)
    tokens = torch.randint(SMALL.vocab, (3, SMALL.sequence))
    logits = model(tokens)
    assert logits.shape == (3, SMALL.sequence, SMALL.vocab)
    gpt.step_loss(logits, tokens).backward()
    assert model.embedding.weight.grad.abs().sum() > 0


def test_positions_are_the_places_of_the_tokens_given():
    model, tokens = gpt.GPT(SMALL), torch.randint(SMALL.vocab, (2, SMALL.sequence))
    whole = model(tokens)
    tail = model(tokens[:, 4:], torch.arange(4, SMALL.sequence))
    assert not torch.allclose(tail, model(tokens[:, 4:]))        # other positions, other logits
    assert tail.shape == whole[:, 4:].shape


def test_batches_pad_documents_with_ignored_targets_that_follow_the_inputs():
    (inputs, targets), = gpt.token_batches(SMALL, batch=64, steps=1, seed=1)
    counted = targets != gpt.IGNORE
    assert counted[:, : SMALL.sequence // 2].all() and not counted.all()     # every document at least half long
    both = counted[:, :-1] & counted[:, 1:]
    assert torch.equal(inputs[:, 1:][both], targets[:, :-1][both])   # the next input is this target
    assert gpt.counted_tokens(targets) == int(counted.sum())
    table = gpt.token_table(SMALL)
    follows = (table[inputs[counted]] == targets[counted][:, None]).any(-1)
    assert follows.all()


def test_the_loss_is_the_mean_over_counted_tokens_only():
    logits = torch.randn(2, 3, 5)
    targets = torch.tensor([[1, 2, gpt.IGNORE], [0, gpt.IGNORE, gpt.IGNORE]])
    losses = gpt.token_losses(logits, targets)
    assert losses[0, 2] == 0 and losses[1, 1] == 0
    assert math.isclose(float(gpt.step_loss(logits, targets)), float(losses.sum()) / 3, rel_tol=1e-6)


def test_one_process_training_clips_and_learns():
    config = gpt.Config(vocab=64, width=32, heads=2, layers=2, sequence=16)
    batches = gpt.token_batches(config, batch=8, steps=12, seed=0)
    run = gpt.one_process_training(config, batches)
    assert len(run.losses) == len(run.norms) == 12
    assert run.losses[-1] < run.losses[0]
    assert max(run.norms) > gpt.CLIP            # the clip acts: the norm is part of the updates
    again = gpt.one_process_training(config, batches)
    assert run.losses == again.losses           # one process, one thread: the same run twice


def test_bad_configs_and_batches_are_refused():
    with pytest.raises(ValueError, match="64 does not split into 5 heads"):
        gpt.Config(width=64, heads=5)
    with pytest.raises(ValueError, match="vocab"):
        gpt.Config(vocab=0)
    with pytest.raises(ValueError, match="shortest"):
        gpt.token_batches(SMALL, batch=2, steps=1, shortest=9)

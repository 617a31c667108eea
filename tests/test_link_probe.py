"""Covers: course.link_probe.

course.link_probe: alpha and beta solved from two round trips, by hand, and on real ranks."""
import pytest

from course import link_probe, timemodel
from course.launch import launch


def test_two_round_trips_solve_for_alpha_and_beta():
    # A link of alpha 0.1 ms and beta 1 GB/s: a round trip is 2 (alpha + b / beta).
    link = timemodel.Link("hand", 1e9, 1e-4, "by hand")
    small, large = 2 * link.seconds(1024), 2 * link.seconds(8_000_000)
    alpha, beta = link_probe.alpha_beta(small, large, 1024, 8_000_000)
    assert alpha == pytest.approx(1e-4) and beta == pytest.approx(1e9)


@pytest.mark.parametrize("small, large, words", [
    (2e-3, 1e-3, "machine was too busy"),      # the large message came back first: noise
    (0.0, 1e-3, "machine was too busy"),
])
def test_a_measurement_that_cannot_be_a_link_says_so(small, large, words):
    with pytest.raises(ValueError, match=words):
        link_probe.alpha_beta(small, large)


def test_sizes_in_the_wrong_order_are_refused():
    with pytest.raises(ValueError, match="larger than the small one"):
        link_probe.alpha_beta(1e-3, 2e-3, small_bytes=8_000_000, large_bytes=1024)


def test_two_gloo_ranks_return_rank_0s_round_trip_for_each_size():
    # Only that the ping-pong runs and times something: which size comes back first is up to
    # the machine's load (a busy machine can return the large one first), so it is not asserted.
    results = launch(link_probe.round_trip_seconds, 2, args=((1024, 2_000_000), (3, 2)), backend="gloo")
    assert results[1] is None
    assert len(results[0]) == 2 and all(seconds > 0 for seconds in results[0])


def test_the_ping_pong_refuses_any_other_number_of_ranks():
    with pytest.raises(ValueError, match="a ping-pong runs on 2 ranks, got 3"):
        launch(link_probe.round_trip_seconds, 3, args=((1024,), (1,)), backend="gloo")


def test_measure_solves_rank_0s_round_trips_into_a_link_the_time_model_takes(monkeypatch):
    hand = timemodel.Link("hand", 1e9, 1e-4, "by hand")
    times = [2 * hand.seconds(1024), 2 * hand.seconds(2_000_000)]
    asked = {}

    def ranks_returning(fn, world_size, args, backend):
        asked.update(fn=fn, world_size=world_size, args=args, backend=backend)
        return [times, None]

    monkeypatch.setattr(link_probe, "launch", ranks_returning)
    link = link_probe.measure(small_repeats=5, large_repeats=3, large_bytes=2_000_000, backend="gloo")
    assert asked == dict(fn=link_probe.round_trip_seconds, world_size=2, args=((1024, 2_000_000), (5, 3)),
                         backend="gloo")
    assert link.alpha == pytest.approx(1e-4) and link.beta == pytest.approx(1e9) and "ping-pong" in link.source
    assert timemodel.ring_all_reduce_seconds(4e6, 2, link) == pytest.approx(2 * (link.alpha + 2e6 / link.beta))

"""course.link_probe: alpha and beta solved from two round trips, by hand, and on real ranks."""
import pytest

from course import link_probe, timemodel


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


def test_two_gloo_ranks_measure_a_link_the_time_model_takes():
    link = link_probe.measure(small_repeats=5, large_repeats=3, large_bytes=2_000_000, backend="gloo")
    assert link.alpha >= 0 and link.beta > 0 and "ping-pong" in link.source
    assert timemodel.ring_all_reduce_seconds(4e6, 2, link) == pytest.approx(2 * (link.alpha + 2e6 / link.beta))

"""The alpha-beta figures of local gloo on this machine (course.timemodel.LOCAL_GLOO).

Measures the link between 2 gloo ranks as lab 2 does, with a ping-pong
(course.link_probe: median round trips of a small and a large message, solved
for alpha and beta), --runs times, and prints the median and range beside the
preset the course keeps as a record.

    python bench/gloo_link.py [--small 1024] [--large 8000000] [--runs 3] [--json PATH]
"""
import argparse
from pathlib import Path

from _results import count, emit, headline_row
from _rounds import spread, spread_text

from course import link_probe
from course.timemodel import LOCAL_GLOO


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", type=int, default=link_probe.SMALL_BYTES, help="bytes of the small message")
    parser.add_argument("--large", type=int, default=link_probe.LARGE_BYTES, help="bytes of the large message")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    links = [link_probe.measure(small_bytes=args.small, large_bytes=args.large, backend="gloo")
             for _ in range(args.runs)]
    runs = [(link.alpha, link.beta) for link in links]
    alpha_ms = spread(a * 1e3 for a, _ in runs)
    beta_gbs = spread(b / 1e9 for _, b in runs)
    measured = f"alpha {spread_text(alpha_ms, '{:.3f}', ' ms')}, beta {spread_text(beta_gbs, '{:.2f}', ' GB/s')}"
    markdown = (f"Ping-pong between 2 gloo ranks (course.link_probe), {args.small:,} B and {args.large:,} B "
                f"(each a median of repeated round trips), solved for the alpha-beta model; {args.runs} runs, "
                f"median (min-max).\n\n"
                f"- measured: {measured}\n- the course's preset {LOCAL_GLOO.name!r}: alpha "
                f"{LOCAL_GLOO.alpha * 1e3:.3f} ms, beta {LOCAL_GLOO.beta / 1e9:.2f} GB/s")
    emit(args.json, title="Local gloo as the time model sees it", markdown=markdown,
         headline=[headline_row("local gloo, 2 ranks", measured, count(args.runs, "run"))],
         figures={"ranks": 2, "alpha_ms": alpha_ms, "beta_GB_per_s": beta_gbs,
                  "preset": {"alpha_ms": LOCAL_GLOO.alpha * 1e3, "beta_GB_per_s": LOCAL_GLOO.beta / 1e9}})


if __name__ == "__main__":
    main()

"""What the drawings of course.drawings and course.split_drawing share: how many ranks a picture
can show readably, the grey of a matrix every rank holds whole, and a colour for each rank.

Used by: course.drawings, course.split_drawing.
"""
from __future__ import annotations

import matplotlib.pyplot as plt

from course import transfer

MOST_RANKS = 16     # past this, labels overlap and nobody can read the picture
WHOLE = "#d9d9d9"   # a matrix every rank holds whole


def _check_drawable(count, name: str = "ranks", counting: str = "ranks") -> None:
    transfer.check_ranks(count, name, counting)
    if count > MOST_RANKS:
        raise ValueError(f"{name}={count} is more than the {MOST_RANKS} {counting} a drawing can show "
                         f"readably: choose {MOST_RANKS} or fewer (2 to 8 read best)")


def _colour(index: int):
    return plt.get_cmap("tab10" if index < 10 else "tab20")(index % 20)

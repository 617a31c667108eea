"""The course's package: launching ranks from a cell, counting what they send,
the models and data of the labs, and what their tests need.

    import course
    results = course.launch(fn, 2)      # run fn on 2 ranks
    results.comm.to_frame()             # what each rank sent, predicted and measured

`course.plots` and `course.throughput` (matplotlib, pandas) are imported on
demand: ranks start faster without them.
"""
from course import check, comm, data, grading, models, timeline, transfer
from course.errors import RankError, RankExited, RankTimeout, RemoteTraceback
from course.launch import RankResults, launch
from course.placement import device, lab_ranks, message_device

__all__ = ["launch", "device", "lab_ranks", "message_device", "RankResults", "RankError",
           "RankExited", "RankTimeout", "RemoteTraceback", "check", "comm", "data", "grading",
           "models", "timeline", "transfer"]

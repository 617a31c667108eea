"""The course's package: launching ranks from a cell, counting what they send.

    import course
    results = course.launch(fn, 2)      # run fn on 2 ranks
    results.comm.to_frame()             # what each rank sent, predicted and measured
"""
from course import comm, transfer
from course.errors import RankError, RankExited, RankTimeout, RemoteTraceback
from course.launch import RankResults, launch
from course.placement import device

__all__ = ["launch", "device", "RankResults", "RankError", "RankExited", "RankTimeout",
           "RemoteTraceback", "comm", "transfer"]

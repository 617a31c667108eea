"""Covers: grader.jail.bwrap, grader.common.cores.

The environment a graded kernel's jail gets beyond what it passes by name: its ranks wait longer and
its threads sleep while they wait, unless the instructor says otherwise. Read from
bwrap.jail_environment, no jail started (the names it passes, and a real jail's, are
tests/test_jail_limits.py's).
"""
from __future__ import annotations


def test_a_graded_kernel_waits_longer_for_its_ranks_unless_the_instructor_says_otherwise(tmp_path):
    from grader.jail import bwrap
    spec = bwrap.Spec(root=str(tmp_path), uid=None)
    env = bwrap.jail_environment(spec, {"PATH": "/usr/bin", "SECRET": "x"})
    assert env["COURSE_RANK_TIMEOUT"] == bwrap.GRADED_RANK_TIMEOUT_S
    assert float(env["COURSE_RANK_TIMEOUT"]) > 30 and "SECRET" not in env
    assert bwrap.jail_environment(spec, {"COURSE_RANK_TIMEOUT": "300"})["COURSE_RANK_TIMEOUT"] == "300"


def test_a_graded_kernels_threads_sleep_while_they_wait_unless_the_instructor_says_otherwise(tmp_path):
    # graded submissions share the cores (grader.common.cores says what spinning costs there)
    from grader.jail import bwrap
    spec = bwrap.Spec(root=str(tmp_path), uid=None)
    assert bwrap.jail_environment(spec, {"PATH": "/usr/bin"})["OMP_WAIT_POLICY"] == "PASSIVE"
    assert bwrap.jail_environment(spec, {"OMP_WAIT_POLICY": "ACTIVE"})["OMP_WAIT_POLICY"] == "ACTIVE"

"""The parts of a grading run, ``python -m grader grade`` (the map: grader/__init__.py)."""

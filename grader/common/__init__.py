"""What the grader's other parts use: the labs and their notebooks, nbgrader's command line,
warm helper processes, the student's text quoted (the map: grader/__init__.py)."""

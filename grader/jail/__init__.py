"""The jail a submission's kernel runs in, and the grader's hold on it (the map: grader/__init__.py)."""

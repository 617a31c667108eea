"""The judge: the hidden tests' answers, kept outside the jail (the map: grader/__init__.py)."""

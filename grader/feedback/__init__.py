"""Feedback pages, made safe from what the submission wrote (the map: grader/__init__.py)."""

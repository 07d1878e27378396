"""The chaos suite: `python -m chaos.run --profile quick|full` (see chaos/run.py)."""

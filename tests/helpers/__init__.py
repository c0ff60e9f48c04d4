"""Helpers the tests in several folders share (CLI runs, fake checkpoints, reference
implementations): ``from helpers.cli import run_cli``; tests/ is on the path (pyproject's pytest
``pythonpath``)."""

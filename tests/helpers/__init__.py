"""Helpers shared by tests in several folders: tiny models, engine probes, references and statistics.

pyproject.toml puts tests/ on pytest's import path, so tests import them as `from helpers.<module> import ...`."""

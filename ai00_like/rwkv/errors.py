"""The one error a user sees when a model file cannot be used."""

from __future__ import annotations

from pathlib import Path


class ModelFileError(Exception):
    """A model, LoRA or state file that is missing, corrupt or unsupported.

    The message always names the file and the problem in one line, so the CLI and
    the HTTP API can show it as it is.
    """

    def __init__(self, path: str | Path | None, problem: str):
        self.path = None if path is None else str(path)
        self.problem = problem
        super().__init__(f"{self.path}: {problem}" if self.path else problem)

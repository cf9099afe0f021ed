"""What a shared store's failure looks like to the routes that need it."""

from __future__ import annotations


class StoreUnavailable(RuntimeError):
    """The shared store cannot be reached (or refused a command); the message names it, never
    its password. The routes answer 503 with it: the model still serves everything else."""

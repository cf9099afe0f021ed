"""What a store's failure looks like to the routes and to the server's start."""

from __future__ import annotations


class StoreUnavailable(RuntimeError):
    """The store cannot be reached or written (a shared store that is down, a full disk, a
    damaged database); the message names it, never its password. The routes that need it
    answer 503, and a reply already made is still given: the model serves everything else."""


class StoreError(RuntimeError):
    """The store cannot be opened at start; one line naming its file and what to do."""

"""The backend tier: one thread that owns a model, its batch slots and its prefix state cache.

backend.py runs the loop; scheduler.py plans each step, sequence.py follows one request
through it, queries.py answers the jobs that need no slot, state_cache.py keeps the states
of prompts already read, and textstream.py turns tokens into text and stop strings.
The middleware talks to it only through the message structs of messages.py.
"""

from .backend import Backend

__all__ = ["Backend"]

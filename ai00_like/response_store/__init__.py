"""Stored responses of the Responses API: their records and the RNN states they ended in."""

from .store import ResponseStore, StoredResponse

__all__ = ["ResponseStore", "StoredResponse"]

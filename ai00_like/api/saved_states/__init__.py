"""Named conversation states: saved once, started from by any chat, completion or response."""

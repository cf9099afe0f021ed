"""The HTTP tier: OpenAI-compatible routes and Ai00's own, on aiohttp (see app.py for the route table)."""

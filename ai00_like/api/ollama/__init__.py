"""Ollama's API (/api/chat, /api/generate, /api/embed, …) as a translation onto the OpenAI routes' planning."""

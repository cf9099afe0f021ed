"""OpenAI-compatible routes: models, chat/completions, completions, embeddings."""

"""Anthropic's Messages API (POST /v1/messages, /v1/messages/count_tokens), read as chat."""

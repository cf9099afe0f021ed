"""Ollama's route table, at Ollama's full paths; api/app.py adds it. /api/pull and
/api/delete change the models folder: they are admin routes (auth.py)."""

from __future__ import annotations

from ..openapi import Route
from . import admin, embed, generation, models
from . import types as t

ADMIN_PATHS = ("/api/pull", "/api/delete")

ROUTES: list[Route] = [
    Route("POST", "/api/chat", generation.chat, "Ollama: chat (NDJSON stream unless stream is false)",
          body=t.ChatRequest, returns=t.ChatResponse, streams=t.ChatResponse),
    Route("POST", "/api/generate", generation.generate, "Ollama: generate from a prompt (raw, or as a chat turn)",
          body=t.GenerateRequest, returns=t.GenerateResponse, streams=t.GenerateResponse),
    Route("POST", "/api/embed", embed.embed, "Ollama: embeddings of one text or many", body=t.EmbedRequest,
          returns=t.EmbedResponse),
    Route("POST", "/api/embeddings", embed.embeddings, "Ollama: the embedding of one prompt (older route)",
          body=t.EmbeddingsRequest, returns=t.EmbeddingsResponse),
    Route("GET", "/api/tags", models.tags, "Ollama: every model this server can serve", returns=t.ModelList),
    Route("GET", "/api/ps", models.running, "Ollama: the loaded models", returns=t.RunningList),
    Route("POST", "/api/show", models.show, "Ollama: a model's details and capabilities", body=t.ModelRequest,
          returns=t.ShowResponse),
    Route("GET", "/api/version", models.version, "Ollama: the version of Ollama's API this server follows",
          returns=t.Version),
    Route("POST", "/api/pull", admin.pull, "Ollama: download a model from the hub into the models folder (admin)",
          body=t.PullRequest, returns=t.Status, streams=t.Status),
    Route("DELETE", "/api/delete", admin.delete, "Ollama: delete a model file from the models folder (admin)",
          body=t.ModelRequest),
    *(Route(method, path, admin.not_supported, "Ollama: not supported by this server (400)")
      for method, path in (("POST", "/api/create"), ("POST", "/api/copy"), ("POST", "/api/push"),
                           ("HEAD", "/api/blobs/{digest}"), ("POST", "/api/blobs/{digest}"))),
]

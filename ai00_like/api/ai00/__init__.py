"""Ai00's own routes: model info, model files, status stream, adapters, admin load/unload."""

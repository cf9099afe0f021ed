"""The Responses API: POST /responses and its stored responses."""

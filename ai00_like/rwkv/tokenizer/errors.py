"""The one error every tokenizer raises."""


class TokenizerError(ValueError):
    """A tokenizer file is missing or malformed; the message names the file (and line)."""

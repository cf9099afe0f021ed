"""ai00-like: a local inference server for RWKV language models."""

import logging

# A library stays quiet unless the application (the CLI's `serve`) configures logging.
logging.getLogger(__name__).addHandler(logging.NullHandler())

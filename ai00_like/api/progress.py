"""A progress bar over the layers of a model being loaded, on an interactive terminal only."""

from __future__ import annotations

import sys

from tqdm import tqdm


class _LayerBar:
    """A tqdm bar over the layers being prepared, shown only on an interactive terminal."""

    def __init__(self, name: str):
        self.bar = tqdm(desc=f"loading {name}", unit="layer", leave=False, file=sys.stderr)

    def update(self, done: int, total: int) -> None:  # called from the loading thread
        self.bar.total = total
        self.bar.n = done
        self.bar.refresh()

    def close(self) -> None:
        self.bar.close()


def layer_bar(name: str) -> _LayerBar | None:
    return _LayerBar(name) if sys.stderr.isatty() else None

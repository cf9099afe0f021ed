"""Where the bundled files are: the demo model, the vocabularies and the web page.

In a clone they are the repository's `assets/` folder. A wheel carries copies inside the
package (`ai00_like/_assets`, put there by setup.py's build step), so a server installed
with pip or pipx finds them from any folder.
"""

from __future__ import annotations

from pathlib import Path

PACKAGED = Path(__file__).resolve().parent / "_assets"
REPOSITORY = Path(__file__).resolve().parents[1] / "assets"


def assets_root() -> Path:
    return PACKAGED if PACKAGED.is_dir() else REPOSITORY

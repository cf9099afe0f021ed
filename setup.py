"""The wheel carries the bundled files (demo model, vocabularies, web page) inside the
package, as ai00_like/_assets (ai00_like/assets.py finds them): a server installed with
pip or pipx then runs from any folder. Everything else is in pyproject.toml."""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ASSETS = Path(__file__).resolve().parent / "assets"
# The demo model with its vocabulary and card, the World vocabulary, the page.
BUNDLED = ["models/demo.st", "models/demo_vocab.txt", "models/README.md", "tokenizer", "www"]


class BuildWithAssets(build_py):
    def run(self):
        super().run()
        if self.editable_mode:  # an editable install reads the repository's assets/ in place
            return
        target = Path(self.build_lib) / "ai00_like" / "_assets"
        for part in BUNDLED:
            source, dest = ASSETS / part, target / part
            dest.parent.mkdir(parents=True, exist_ok=True)
            if source.is_dir():
                shutil.copytree(source, dest, dirs_exist_ok=True)
            else:
                shutil.copy2(source, dest)


setup(cmdclass={"build_py": BuildWithAssets})

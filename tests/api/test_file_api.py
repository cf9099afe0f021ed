"""The file-system helper routes (/admin/files/*): what they do, and what they refuse.

Every refused request is checked against a snapshot of the whole tree (the server's folder
and a folder beside it that holds a "secret"): a refusal must leave every file as it was.
"""

from __future__ import annotations

import errno
import hashlib
import io
import os
import shutil
import zipfile
from pathlib import Path

import pytest
from api_helpers import ServerThread, write_model

from ai00_like.api import files
from ai00_like.config import parse_config

KEY = "file-api-admin-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
GOOD_CONFIG = '[model]\npath = "../models"\nname = ""\nmax_batch = 2\n'


def snapshot(root: Path) -> dict[str, tuple]:
    """Every entry under root: kind, and for files size, mtime and content hash."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            rel = str(p.relative_to(root))
            if p.is_symlink():
                out[rel] = ("link", os.readlink(p))
            elif p.is_dir():
                out[rel] = ("dir",)
            else:
                st = p.stat()
                out[rel] = ("file", st.st_size, st.st_mtime_ns, hashlib.sha256(p.read_bytes()).hexdigest())
    return out


def make_zip(entries: dict[str, bytes], *, symlink: str | None = None) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in entries.items():
            z.writestr(zipfile.ZipInfo(name), data, compress_type=zipfile.ZIP_DEFLATED)
        if symlink:
            info = zipfile.ZipInfo("link")
            info.external_attr = (0o120777 << 16)
            z.writestr(info, symlink)
    return buf.getvalue()


def lying_zip(data: bytes, declared: int) -> bytes:
    """A zip whose headers say its one entry unpacks to `declared` bytes."""
    raw = bytearray(make_zip({"zeros.bin": data}))
    raw[22:26] = declared.to_bytes(4, "little")  # local file header: uncompressed size
    central = raw.index(b"PK\x01\x02")
    raw[central + 24:central + 28] = declared.to_bytes(4, "little")
    return bytes(raw)


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    top = tmp_path_factory.mktemp("files")
    base = top / "srv"
    models = base / "assets" / "models"
    models.mkdir(parents=True)
    (base / "assets" / "configs").mkdir()
    (base / "assets" / "tokenizer").mkdir()
    (base / "assets" / "unzip" / "old").mkdir(parents=True)
    (base / "assets" / "unzip" / "old" / "keep.txt").write_text("old output")
    outside = top / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("s3cr3t-content")
    (outside / "secret.toml").write_text(GOOD_CONFIG)
    (outside / "outside.zip").write_bytes(make_zip({"a.txt": b"a"}))
    write_model(models / "tiny.st")
    (models / "notes.txt").write_text("hello")
    (models / "escape").symlink_to(outside, target_is_directory=True)
    (models / "secret-link.txt").symlink_to(outside / "secret.txt")
    (models / "secret-link.toml").symlink_to(outside / "secret.toml")
    (base / "assets" / "configs" / "app.toml").write_text(GOOD_CONFIG)
    (base / "assets" / "unzip" / "outlink").symlink_to(outside, target_is_directory=True)
    (base / "assets" / "www").mkdir()
    (base / "assets" / "www" / "index.html").write_text("<h1>page</h1>")
    (base / "assets" / "www" / "secret-link.txt").symlink_to(outside / "secret.txt")
    (base / "assets" / "models" / "good.zip").write_bytes(make_zip({"dir/x.txt": b"x" * 10, "y.txt": b"y"}))
    (base / "assets" / "models" / "slip.zip").write_bytes(make_zip({"ok.txt": b"1", "../../evil.txt": b"evil"}))
    (base / "assets" / "models" / "slip-abs.zip").write_bytes(make_zip({"/tmp/evil-abs.txt": b"evil"}))
    (base / "assets" / "models" / "slip-link.zip").write_bytes(make_zip({"ok.txt": b"1"}, symlink=str(outside)))
    (base / "assets" / "models" / "bomb.zip").write_bytes(make_zip({"zeros.bin": bytes(4 << 20)}))
    clash = io.BytesIO()
    with zipfile.ZipFile(clash, "w") as z:
        z.writestr("same.txt", b"1")
        with pytest.warns(UserWarning, match="Duplicate name"):
            z.writestr("same.txt", b"2")
    (base / "assets" / "models" / "clash.zip").write_bytes(clash.getvalue())
    (base / "assets" / "models" / "liar.zip").write_bytes(lying_zip(bytes(4 << 20), declared=100))
    return top


@pytest.fixture(scope="module")
def server(tree):
    base = tree / "srv"
    config = parse_config(f"""
[model]
path = "assets/models"
name = ""
[listen]
ip = "127.0.0.1"
port = 0
admin_key = "{KEY}"
max_body_bytes = 65536
[web]
path = "assets/www"
""", source="test-config.toml", base_dir=base)
    with ServerThread(config) as s:
        yield s


def post(server, path, body, headers=AUTH):
    return server.post(path, body, headers=headers)


# ------------------------------------------------------------------------------ what works


def test_dir_lists_files_with_size_hash_and_model_info(server, tree):
    r = post(server, "/admin/files/dir", {"path": "assets/models", "is_sha": True})
    assert r.status == 200, r
    by_name = {f["name"]: f for f in r.json()}
    assert by_name["tiny.st"]["info"]["num_layer"] == 2
    assert by_name["tiny.st"]["size"] == (tree / "srv/assets/models/tiny.st").stat().st_size
    assert by_name["notes.txt"]["sha"] == hashlib.sha256(b"hello").hexdigest()
    assert by_name["notes.txt"]["info"] is None
    # Links that lead outside are neither listed nor read.
    assert "secret-link.txt" not in by_name and "escape" not in by_name
    r = post(server, "/admin/files/ls", {"path": "assets/models"})
    assert r.status == 200 and all(f["sha"] == "" for f in r.json())


def test_roots_name_the_folders_the_routes_take(server, tree):
    r = server.get("/admin/files/roots", headers=AUTH)
    assert r.status == 200, r
    # assets/www and the configured web folder are the same; the unzip roots need not exist yet.
    assert r.json() == {"read": ["assets/models", "assets/tokenizer", "assets/configs", "assets/www"],
                        "write": ["assets/unzip", "assets/temp"]}
    for folder in r.json()["read"]:
        assert post(server, "/admin/files/dir", {"path": folder}).status == 200, folder


def test_unzip_replaces_the_output_folder(server, tree):
    out = tree / "srv/assets/unzip/old"
    r = post(server, "/admin/files/unzip", {"zip_path": "assets/models/good.zip", "target_dir": "assets/unzip/old"})
    assert r.status == 200, r
    assert r.json() == {"output": "assets/unzip/old", "files": 2, "bytes": 11}
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*")) == ["dir", "dir/x.txt", "y.txt"]


def test_config_load_and_save(server, tree):
    r = post(server, "/admin/files/config/load", {"path": "assets/configs/app.toml"})
    assert r.status == 200, r
    assert r.json()["config"]["model"]["max_batch"] == 2 and r.json()["text"] == GOOD_CONFIG
    new = GOOD_CONFIG.replace("max_batch = 2", "max_batch = 3")
    r = post(server, "/admin/files/config/save", {"path": "assets/configs/app.toml", "config": new})
    assert r.status == 200, r
    assert (tree / "srv/assets/configs/app.toml").read_text() == new
    assert [p.name for p in (tree / "srv/assets/configs").iterdir()] == ["app.toml"]  # no temp file left


def test_config_save_keeps_the_file_mode(server, tree):
    configs = tree / "srv/assets/configs"
    (configs / "app.toml").chmod(0o640)
    r = post(server, "/admin/files/config/save", {"path": "assets/configs/app.toml", "config": GOOD_CONFIG})
    assert r.status == 200, r
    assert (configs / "app.toml").stat().st_mode & 0o777 == 0o640
    # A new config gets the mode any new file gets here (not the temporary file's 0600).
    (tree / "reference").write_text("")
    r = post(server, "/admin/files/config/save", {"path": "assets/configs/new.toml", "config": GOOD_CONFIG})
    assert r.status == 200, r
    try:
        assert (configs / "new.toml").stat().st_mode & 0o777 == (tree / "reference").stat().st_mode & 0o777
    finally:
        (configs / "new.toml").unlink()
        (tree / "reference").unlink()


@pytest.mark.parametrize("failing", ["fsync", "replace", "mkstemp"])
def test_a_config_save_the_disk_refuses_leaves_the_old_file(server, tree, monkeypatch, failing):
    """A write that fails (disk full while writing, a rename or a temp file refused): a 500
    naming the file and the reason, the old config as it was, no temp file left, and the
    server goes on serving."""
    configs = tree / "srv/assets/configs"
    new = GOOD_CONFIG.replace("max_batch = 2", "max_batch = 5")
    temps_seen: list[str] = []

    def fail(*args, **kwargs):
        temps_seen.extend(p.name for p in configs.iterdir() if p.name.endswith(".tmp"))
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    (configs / "app.toml").write_text(GOOD_CONFIG)
    before = snapshot(tree)
    monkeypatch.setattr(files.tempfile if failing == "mkstemp" else files.os, failing, fail)
    r = post(server, "/admin/files/config/save", {"path": "assets/configs/app.toml", "config": new})
    monkeypatch.undo()
    assert r.status == 500, r
    error = r.json()["error"]
    assert (error["type"], error["code"], error["param"]) == ("server_error", "write_failed", "path")
    assert error["message"] == "'path': could not write assets/configs/app.toml: No space left on device"
    # It failed midway: the new text was in a temporary file beside the config (not for mkstemp).
    assert len(temps_seen) == (0 if failing == "mkstemp" else 1)
    assert snapshot(tree) == before
    r = post(server, "/admin/files/config/load", {"path": "assets/configs/app.toml"})
    assert r.status == 200 and r.json()["text"] == GOOD_CONFIG
    r = post(server, "/admin/files/config/save", {"path": "assets/configs/app.toml", "config": new})
    assert r.status == 200, r
    assert (configs / "app.toml").read_text() == new
    assert [p.name for p in configs.iterdir()] == ["app.toml"]


# ------------------------------------------------------------------------------ what is refused


REFUSED = [
    ("/admin/files/dir", {"path": "assets/models/../../../outside"}),
    ("/admin/files/dir", {"path": ".."}),
    ("/admin/files/dir", {"path": "assets/models/..%2F..%2F..%2Foutside"}),
    ("/admin/files/dir", {"path": "assets%2fmodels"}),
    ("/admin/files/dir", {"path": "assets\\models\\..\\..\\..\\outside"}),
    ("/admin/files/dir", {"path": "/etc"}),
    ("/admin/files/dir", {"path": "~"}),
    ("/admin/files/dir", {"path": "assets/models/escape"}),
    ("/admin/files/dir", {"path": "ai00_like"}),
    ("/admin/files/config/load", {"path": "assets/models/secret-link.toml"}),
    ("/admin/files/config/load", {"path": "assets/models/escape/secret.toml"}),
    ("/admin/files/config/load", {"path": "assets/models/notes.txt"}),
    ("/admin/files/config/save", {"path": "assets/models/secret-link.toml", "config": GOOD_CONFIG}),
    ("/admin/files/config/save", {"path": "../outside/secret.toml", "config": GOOD_CONFIG}),
    ("/admin/files/config/save", {"path": "assets/models/secret-link.txt", "config": GOOD_CONFIG}),
    ("/admin/files/config/save", {"path": "assets/models/escape/new.toml", "config": GOOD_CONFIG}),
    ("/admin/files/unzip", {"zip_path": "assets/models/escape/outside.zip", "target_dir": "assets/unzip/x"}),
    ("/admin/files/unzip", {"zip_path": "assets/models/good.zip", "target_dir": "assets/models"}),
    ("/admin/files/unzip", {"zip_path": "assets/models/good.zip", "target_dir": "assets/unzip"}),
    ("/admin/files/unzip", {"zip_path": "assets/models/good.zip", "target_dir": "assets/unzip/../../../outside"}),
    ("/admin/files/unzip", {"zip_path": "assets/models/good.zip", "target_dir": "assets/unzip/outlink"}),
    ("/admin/files/unzip", {"zip_path": "assets/models/good.zip", "target_dir": "assets/unzip/outlink/new"}),
    ("/admin/files/unzip", {"zip_path": "assets/models/slip.zip", "target_dir": "assets/unzip/old"}),
    ("/admin/files/unzip", {"zip_path": "assets/models/slip-abs.zip", "target_dir": "assets/unzip/old"}),
    ("/admin/files/unzip", {"zip_path": "assets/models/slip-link.zip", "target_dir": "assets/unzip/old"}),
]


@pytest.mark.parametrize("route,body", REFUSED, ids=[f"{r}:{next(iter(b.values()))}" for r, b in REFUSED])
def test_paths_outside_the_roots_are_refused_and_nothing_changes(server, tree, route, body):
    before = snapshot(tree)
    r = post(server, route, body)
    assert r.status == 403, r
    assert r.json()["error"]["code"] == "path_not_allowed"
    assert snapshot(tree) == before
    assert not Path("/tmp/evil-abs.txt").exists()


def test_zip_bomb_is_refused_and_nothing_changes(server, tree, monkeypatch):
    monkeypatch.setattr(files, "MAX_UNZIP_BYTES", 1 << 20)
    before = snapshot(tree)
    r = post(server, "/admin/files/unzip", {"zip_path": "assets/models/bomb.zip", "target_dir": "assets/unzip/old"})
    assert r.status == 413, r
    assert r.json()["error"]["code"] == "archive_too_large"
    assert snapshot(tree) == before


def test_an_archive_with_too_many_entries_is_refused_and_nothing_changes(server, tree, monkeypatch):
    monkeypatch.setattr(files, "MAX_UNZIP_ENTRIES", 1)  # good.zip holds 2
    before = snapshot(tree)
    for target in ("assets/unzip/old", "assets/unzip/many"):
        r = post(server, "/admin/files/unzip", {"zip_path": "assets/models/good.zip", "target_dir": target})
        assert r.status == 413, r
        assert r.json()["error"]["code"] == "archive_too_large"
        assert r.json()["error"]["message"] == "the archive has 2 entries, more than 1"
    assert snapshot(tree) == before
    # At the limit it unpacks.
    monkeypatch.setattr(files, "MAX_UNZIP_ENTRIES", 2)
    r = post(server, "/admin/files/unzip", {"zip_path": "assets/models/good.zip", "target_dir": "assets/unzip/many"})
    assert r.status == 200 and r.json()["files"] == 2, r
    shutil.rmtree(tree / "srv/assets/unzip/many")


def test_an_archive_that_lies_about_its_size_is_refused_and_nothing_changes(server, tree):
    before = snapshot(tree)
    r = post(server, "/admin/files/unzip", {"zip_path": "assets/models/liar.zip", "target_dir": "assets/unzip/old"})
    assert r.status == 400 and "broken zip" in r.json()["error"]["message"], r
    assert snapshot(tree) == before


def test_an_archive_with_clashing_entries_is_refused_and_nothing_changes(server, tree):
    before = snapshot(tree)
    r = post(server, "/admin/files/unzip", {"zip_path": "assets/models/clash.zip", "target_dir": "assets/unzip/old"})
    assert r.status == 400 and "clash" in r.json()["error"]["message"], r
    assert snapshot(tree) == before


def test_an_invalid_config_is_not_saved(server, tree):
    before = snapshot(tree)
    for text in ("[model\n", "[model]\nmax_batch = 0\n", "[modle]\n"):
        r = post(server, "/admin/files/config/save", {"path": "assets/configs/app.toml", "config": text})
        assert r.status == 400, r
        assert r.json()["error"]["code"] == "invalid_config"
    assert snapshot(tree) == before


def test_oversized_body_is_refused(server, tree):
    before = snapshot(tree)
    r = post(server, "/admin/files/config/save", {"path": "assets/configs/app.toml",
                                                  "config": GOOD_CONFIG + "#" * 100_000})
    assert r.status == 413, r
    assert snapshot(tree) == before


@pytest.mark.parametrize("headers,status", [({}, 401), ({"Authorization": "Bearer wrong"}, 401)])
def test_admin_calls_without_the_key_are_refused(server, tree, headers, status):
    before = snapshot(tree)
    for route, body in [("/admin/files/dir", {"path": "assets/models"}),
                        ("/admin/files/unzip", {"zip_path": "assets/models/good.zip", "target_dir": "assets/unzip/k"}),
                        ("/admin/files/config/load", {"path": "assets/configs/app.toml"}),
                        ("/admin/files/config/save", {"path": "assets/configs/app.toml", "config": GOOD_CONFIG})]:
        r = post(server, route, body, headers=headers)
        assert r.status == status, (route, r)
        assert b"tiny.st" not in r.body  # no listing leaks out
    r = server.get("/admin/files/roots", headers=headers)
    assert r.status == status and b"assets/models" not in r.body
    assert snapshot(tree) == before


@pytest.mark.parametrize("path", ["/../outside/secret.txt", "/%2e%2e/%2e%2e/outside/secret.txt",
                                  "/..%2f..%2foutside%2fsecret.txt", "/secret-link.txt", "/%2fetc%2fpasswd",
                                  "//etc/passwd", "/..%5c..%5coutside%5csecret.txt"])
def test_the_web_page_route_serves_nothing_outside_its_folder(server, tree, path):
    assert server.get("/").body == b"<h1>page</h1>"
    r = server.get(path)
    assert r.status in (403, 404), r
    assert b"s3cr3t-content" not in r.body and b"root:x:" not in r.body

"""`pull`'s guards, against stand-ins of the hub and of a CDN on the loopback (HF_ENDPOINT), with
the real huggingface_hub client, the real command and the real server: HF_TOKEN goes to the
hub's own origin only, never to the host the hub redirects a file to; a name that could reach
another path or host is refused before the hub is asked; a file the disk has no room for is
refused before a byte is fetched, counting what an earlier pull left; each repository's file
grows in a partial file of its own."""

from __future__ import annotations

import os
import subprocess
import time
from contextlib import contextmanager

import pytest
from hub_helpers import StandInHub, run_pull

from ai00_like.hub.catalogue import InvalidName, resolve
from ai00_like.hub.download import partial_path

pytest.importorskip("huggingface_hub")

REPO, FILE = "BlinkDL/rwkv7-g1", "rwkv7-g1d-0.1b-20260129-ctx8192.pth"  # the catalogue's rwkv7-g1-0.1b
DATA = os.urandom(5_000_000)
TOKEN = "hf_StandInTokenThatMustStayOnTheHub"
PETABYTE = 10**15  # what the hub may say of a file: more than any disk here has free

# Names that would make a request to another path of the hub's host (with the token), to
# another host, or name a file outside the models folder; and the reason each one is given.
BAD_NAMES = [
    ("BlinkDL/rwkv7-g1/../../other/x.pth", "'..' segment"),
    (f"{REPO}/../{FILE}", "'..' segment"),
    (f"{REPO}/./{FILE}", "'..' segment"),
    (f"/{REPO}/{FILE}", "absolute path"),
    (f"{REPO}\\{FILE}", "backslash"),
    (f"{REPO}//{FILE}", "empty segment"),
    (f"{REPO}/{FILE}/", "empty segment"),
    (f"http://127.0.0.1:9/{REPO}/{FILE}", "is a URL"),
    (f"hf://{REPO}/{FILE}", "is a URL"),
    (f"{REPO}/https://127.0.0.1:9/{FILE}", "is a URL"),
    (f"Blink..DL/rwkv7-g1/{FILE}", "repository id"),
]


@pytest.fixture()
def hub():
    return StandInHub(REPO, FILE, DATA)


def requests_for_the_file(hub: StandInHub) -> list[tuple[str, dict[str, str]]]:
    return [(method, headers) for method, path, headers in hub.heard if path.endswith(f"/{FILE}")]


# ---------------------------------------------------------------------------------- the token


def test_the_token_goes_to_the_hub_and_not_to_the_cdn_it_redirects_to(tmp_path):
    cdn = StandInHub(REPO, FILE, DATA)
    hub = StandInHub(REPO, FILE, DATA, cdn=cdn)  # HEAD and GET answer 302 to the CDN, as the hub does for LFS
    done = run_pull(hub.url, f"{REPO}/{FILE}", tmp_path / "models", tmp_path, HF_TOKEN=TOKEN)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "models" / FILE).read_bytes() == DATA  # the bytes came from the CDN
    asked = requests_for_the_file(hub)
    assert asked and asked[0][0] == "HEAD" and asked[0][1].get("authorization") == f"Bearer {TOKEN}"
    fetched = requests_for_the_file(cdn)
    assert [method for method, _ in fetched] == ["GET"]
    assert all("authorization" not in headers for _, headers in fetched)
    assert all(TOKEN not in str(heard) for heard in cdn.heard)  # under no header at all


def test_the_token_goes_with_a_file_the_hub_serves_itself(hub, tmp_path):
    done = run_pull(hub.url, f"{REPO}/{FILE}", tmp_path / "models", tmp_path, HF_TOKEN=TOKEN)
    assert done.returncode == 0, done.stderr
    asked = requests_for_the_file(hub)
    assert [method for method, _ in asked] == ["HEAD", "GET"]  # a gated repository's bytes need it too
    assert all(headers.get("authorization") == f"Bearer {TOKEN}" for _, headers in asked)


# ---------------------------------------------------------------------------------- the names


@pytest.mark.parametrize("name, reason", BAD_NAMES)
def test_a_name_that_could_leave_the_repository_is_refused(name, reason):
    with pytest.raises(InvalidName, match=reason) as refused:
        resolve(name)
    assert "\n" not in str(refused.value)


def test_plain_names_still_resolve():
    assert resolve(f"some-one/some.repo_1/sub/{FILE}")[:2] == ("some-one/some.repo_1", f"sub/{FILE}")
    assert resolve(f"{REPO}/a..b.pth")[:2] == (REPO, "a..b.pth")  # dots inside a segment are a name's own


@pytest.mark.parametrize("name, reason", BAD_NAMES[:2] + BAD_NAMES[7:8])
def test_the_command_refuses_a_bad_name_in_one_line_before_asking_the_hub(hub, tmp_path, name, reason):
    failed = run_pull(hub.url, name, tmp_path / "models", tmp_path, HF_TOKEN=TOKEN)
    assert failed.returncode == 2 and failed.stderr.count("\n") == 1 and reason in failed.stderr
    assert hub.heard == [] and not (tmp_path / "models").exists()


@contextmanager
def serving(hub: StandInHub, folder, monkeypatch):
    import httpx

    from api_helpers import ServerThread, config_for

    monkeypatch.setenv("HF_ENDPOINT", hub.url)  # the server runs in this process
    with ServerThread(config_for(folder, model=""), wait_for_load=False) as s:
        with httpx.Client(base_url=s.base_url.removesuffix("/v1"), timeout=30) as client:
            yield client


def test_the_server_refuses_a_bad_name_before_asking_the_hub(hub, tmp_path, monkeypatch):
    with serving(hub, tmp_path / "models", monkeypatch) as client:
        for name, reason in BAD_NAMES:
            refused = client.post("/admin/models/pull", json={"name": name})
            error = refused.json()["error"]
            assert refused.status_code == 400 and error["param"] == "name" and reason in error["message"], name
        assert client.get("/admin/models/pull").json() == []
    assert hub.heard == []


# ---------------------------------------------------------------------------------- the disk


def test_a_file_larger_than_the_free_space_is_refused_before_a_byte(hub, tmp_path, monkeypatch):
    hub.declared_size = PETABYTE
    failed = run_pull(hub.url, f"{REPO}/{FILE}", tmp_path / "models", tmp_path)
    assert failed.returncode == 2 and failed.stderr.count("\n") == 1
    assert "needs 1000000.00 GB more" in failed.stderr and f"{tmp_path / 'models'} has" in failed.stderr
    with serving(hub, tmp_path / "models", monkeypatch) as client:
        refused = client.post("/admin/models/pull", json={"name": "rwkv7-g1-0.1b"})
        error = refused.json()["error"]
        assert refused.status_code == 400 and error["code"] == "insufficient_storage" and error["param"] == "name"
        assert "free" in error["message"] and str(tmp_path / "models") in error["message"]
        assert client.get("/admin/models/pull").json() == []
    assert [method for method, _ in requests_for_the_file(hub)] == ["HEAD", "HEAD"]  # no GET
    assert not (tmp_path / "models").exists()


@pytest.fixture()
def tiny_disk(tmp_path):
    """An 8 MiB tmpfs as the models folder: a disk a 5 MB file fits on, only just. Needs
    root (mount); skipped where that is not allowed."""
    folder = tmp_path / "models"
    folder.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(folder)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield folder
    finally:
        if subprocess.run(["umount", str(folder)]).returncode != 0:
            subprocess.run(["umount", "-l", str(folder)])


def test_the_room_check_counts_what_the_partial_file_holds(hub, tiny_disk, tmp_path):
    filler = tiny_disk / "other-model.pth"
    filler.write_bytes(bytes(4_000_000))  # about 4.4 MB left: less than the 5 MB file
    refused = run_pull(hub.url, f"{REPO}/{FILE}", tiny_disk, tmp_path)
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1
    assert "needs 5.00 MB more" in refused.stderr and f"{tiny_disk} has" in refused.stderr
    assert hub.ranges == []
    filler.unlink()
    part = partial_path(tiny_disk, REPO, FILE)  # an earlier pull's 4 MB: 1 MB still needed, and 4.4 MB free
    part.parent.mkdir()
    part.write_bytes(DATA[:4_000_000])
    done = run_pull(hub.url, f"{REPO}/{FILE}", tiny_disk, tmp_path)
    assert done.returncode == 0, done.stderr
    assert (tiny_disk / FILE).read_bytes() == DATA and hub.ranges == [4_000_000]


# ---------------------------------------------------------------------------------- the partial files


def test_each_repository_downloads_into_a_partial_file_of_its_own(hub, tmp_path):
    theirs = partial_path(tmp_path / "models", "someone/else", FILE)  # another repository's file of that name
    theirs.parent.mkdir(parents=True)
    theirs.write_bytes(b"another repository's half-downloaded bytes")
    done = run_pull(hub.url, f"{REPO}/{FILE}", tmp_path / "models", tmp_path)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "models" / FILE).read_bytes() == DATA and hub.ranges == [0]  # not resumed from theirs
    assert theirs.read_bytes() == b"another repository's half-downloaded bytes"


def test_the_server_reports_the_bytes_of_the_repositorys_partial_file(hub, tmp_path, monkeypatch):
    part = partial_path(tmp_path / "models", REPO, FILE)
    part.parent.mkdir(parents=True)
    part.write_bytes(DATA[:2_000_000])  # an earlier pull's
    hub.cut = 99  # every try of this one breaks off
    with serving(hub, tmp_path / "models", monkeypatch) as client:
        started = client.post("/admin/models/pull", json={"name": "rwkv7-g1-0.1b"}).json()
        for _ in range(600):  # 60 s at most: huggingface_hub tries six times, a second apart
            job = next(j for j in client.get("/admin/models/pull").json() if j["id"] == started["id"])
            if job["status"] != "running":
                break
            time.sleep(0.1)
    assert job["status"] == "failed" and "a retry resumes" in job["error"]
    assert job["bytes"] == part.stat().st_size >= 2_000_000 and job["total"] == len(DATA)

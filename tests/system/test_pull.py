"""`ai00-like pull` against a stand-in of the Hugging Face hub on the loopback (HF_ENDPOINT):
the real huggingface_hub client, the real command. A pull lands whole and verified under its
final name; an interrupted one resumes where it stopped; a file that does not match the
hub's SHA-256, a missing file and an unreachable hub each end in one line and leave no file
under the final name; a different file already there is never overwritten."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from hub_helpers import StandInHub, run_pull
from process_helpers import free_port

from ai00_like.hub.catalogue import load_catalogue, resolve

pytest.importorskip("huggingface_hub")

REPO, FILE = "BlinkDL/rwkv7-g1", "rwkv7-g1d-0.1b-20260129-ctx8192.pth"  # the catalogue's rwkv7-g1-0.1b
# Larger than huggingface_hub's 10 MB write chunk, so a download broken off halfway leaves
# something on disk to resume from.
DATA = os.urandom(24_000_000)


@pytest.fixture(scope="module")
def hub():
    return StandInHub(REPO, FILE, DATA)


def pull(endpoint: str, name: str, folder, home) -> subprocess.CompletedProcess:
    return run_pull(endpoint, name, folder, home)


def test_the_catalogue_is_well_formed():
    models = load_catalogue()
    assert len({m.alias for m in models}) == len(models) >= 8
    assert {m.repo for m in models} == {"BlinkDL/rwkv7-g1", "BlinkDL/rwkv-7-world"}
    assert all(m.thinking in ("none", "think", "effort") and m.size > 0 and m.file.endswith(".pth") for m in models)
    assert {m.thinking for m in models if m.repo.endswith("world")} == {"none"}
    small, large = models[0], max(models, key=lambda m: m.size)
    assert small.recommended(8 << 30) == "bf16" and large.recommended(8 << 30) is None  # 26.5 GB in 8 GiB


def test_the_alias_is_the_catalogues_file():
    assert resolve("rwkv7-g1-0.1b") == (REPO, FILE, next(m for m in load_catalogue() if m.file == FILE))
    assert resolve("someone/some-repo/sub/model.pth")[:2] == ("someone/some-repo", "sub/model.pth")


def test_a_pull_lands_whole_under_its_final_name(hub, tmp_path):
    done = pull(hub.url, "rwkv7-g1-0.1b", tmp_path / "models", tmp_path)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "models" / FILE).read_bytes() == DATA
    assert done.stdout.splitlines()[0] == str(tmp_path / "models" / FILE)
    assert 'thinking = "effort"' in done.stdout  # how to serve it
    assert sorted(p.name for p in (tmp_path / "models").iterdir()) == [FILE]  # nothing left behind
    again = pull(hub.url, "rwkv7-g1-0.1b", tmp_path / "models", tmp_path)  # already there: nothing fetched
    assert again.returncode == 0 and (tmp_path / "models" / FILE).read_bytes() == DATA


def test_a_broken_download_resumes_within_the_pull(hub, tmp_path):
    hub.cut, hub.ranges = 1, []
    done = pull(hub.url, f"{REPO}/{FILE}", tmp_path / "models", tmp_path)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "models" / FILE).read_bytes() == DATA
    assert hub.ranges[0] == 0 and hub.ranges[1] > 0  # resumed, not begun again


def test_a_failed_pull_resumes_on_the_next_one(hub, tmp_path):
    hub.cut, hub.ranges = 99, []
    failed = pull(hub.url, f"{REPO}/{FILE}", tmp_path / "models", tmp_path)
    assert failed.returncode == 2 and failed.stderr.count("\n") == 1 and "a retry resumes" in failed.stderr
    assert not (tmp_path / "models" / FILE).exists()  # nothing partial under the final name
    hub.cut, hub.ranges = 0, []
    done = pull(hub.url, f"{REPO}/{FILE}", tmp_path / "models", tmp_path)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "models" / FILE).read_bytes() == DATA
    assert hub.ranges[0] > 0  # from where the failed pull stopped


def test_a_file_that_does_not_match_its_checksum_is_removed(hub, tmp_path):
    hub.corrupt = True
    try:
        failed = pull(hub.url, "rwkv7-g1-0.1b", tmp_path / "models", tmp_path)
    finally:
        hub.corrupt = False
    assert failed.returncode == 2
    assert failed.stderr.count("\n") == 1 and "SHA-256" in failed.stderr
    assert not (tmp_path / "models" / FILE).exists()


@pytest.mark.parametrize("name, words", [
    (f"{REPO}/no-such-file.pth", "not on the hub"),
    ("no-such-alias", "unknown model"),
])
def test_what_is_not_there_is_one_line(hub, tmp_path, name, words):
    failed = pull(hub.url, name, tmp_path / "models", tmp_path)
    assert failed.returncode == 2 and failed.stderr.count("\n") == 1 and words in failed.stderr
    assert not (tmp_path / "models").exists() or not any((tmp_path / "models").iterdir())


def test_an_unreachable_hub_is_one_line(tmp_path):
    failed = pull(f"http://127.0.0.1:{free_port()}", "rwkv7-g1-0.1b", tmp_path / "models", tmp_path)
    assert failed.returncode == 2 and failed.stderr.count("\n") == 1 and "could not reach the hub" in failed.stderr


def test_a_different_file_under_the_name_is_kept(hub, tmp_path):
    (tmp_path / "models").mkdir()
    mine = tmp_path / "models" / FILE
    mine.write_bytes(b"my own weights")
    failed = pull(hub.url, "rwkv7-g1-0.1b", tmp_path / "models", tmp_path)
    assert failed.returncode == 2 and "move it away" in failed.stderr
    assert mine.read_bytes() == b"my own weights"


# ------------------------------------------------------------------ the server's downloads (the page's panel)


@pytest.fixture()
def server(hub, tmp_path, monkeypatch):
    import httpx

    from api_helpers import ServerThread, config_for

    monkeypatch.setenv("HF_ENDPOINT", hub.url)  # the server runs in this process
    with ServerThread(config_for(tmp_path / "models", model=""), wait_for_load=False) as s:
        with httpx.Client(base_url=s.base_url.removesuffix("/v1"), timeout=30) as client:
            yield s, client


def wait_done(client, ident: str) -> dict:
    for _ in range(300):  # 30 s at most
        job = next(j for j in client.get("/admin/models/pull").json() if j["id"] == ident)
        if job["status"] != "running":
            return job
        time.sleep(0.1)
    raise AssertionError("the download did not end")


def test_the_server_downloads_a_catalogue_model(server, tmp_path):
    _, client = server
    listed = {m["alias"]: m for m in client.get("/api/models/catalogue").json()}
    assert listed["rwkv7-g1-0.1b"]["file"] == FILE and listed["rwkv7-g1-0.1b"]["downloaded"] is False
    assert listed["rwkv7-g1-0.1b"]["fits"] in ("bf16", "int8", "nf4")
    started = client.post("/admin/models/pull", json={"name": "rwkv7-g1-0.1b"})
    assert started.status_code == 200 and started.json()["status"] == "running"
    done = wait_done(client, started.json()["id"])
    assert done["status"] == "done" and done["bytes"] == done["total"] == len(DATA)
    assert done["path"] == str(tmp_path / "models" / FILE) and done["thinking"] == "effort"
    assert (tmp_path / "models" / FILE).read_bytes() == DATA
    assert {m["alias"]: m for m in client.get("/api/models/catalogue").json()}["rwkv7-g1-0.1b"]["downloaded"]


def test_a_failed_server_download_says_why(server, hub, tmp_path):
    _, client = server
    hub.corrupt = True
    try:
        started = client.post("/admin/models/pull", json={"name": f"{REPO}/{FILE}"}).json()
        done = wait_done(client, started["id"])
    finally:
        hub.corrupt = False
    assert done["status"] == "failed" and "SHA-256" in done["error"]
    assert not (tmp_path / "models" / FILE).exists()


def test_what_cannot_be_pulled_is_refused_at_once(server, monkeypatch):
    _, client = server
    refused = client.post("/admin/models/pull", json={"name": "no-such-model"})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "name"
    missing = client.post("/admin/models/pull", json={"name": f"{REPO}/no-such-file.pth"})
    assert missing.status_code == 404 and "not on the hub" in missing.json()["error"]["message"]
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{free_port()}")  # the hub is away
    away = client.post("/admin/models/pull", json={"name": "rwkv7-g1-0.1b"})
    assert away.status_code == 400 and away.json()["error"]["code"] == "hub_unreachable"
    assert client.get("/admin/models/pull").json() == []  # nothing was started


def test_a_pull_can_be_converted_at_once(tmp_path):
    from api_helpers import write_model

    from ai00_like.rwkv import load_model

    model_file = "rwkv7-g1a-0.1b-20250728-ctx4096.pth"  # a real (small) model under a catalogue name
    hub = StandInHub(REPO, model_file, write_model(tmp_path / "model.st").read_bytes())
    done = subprocess.run([sys.executable, "-m", "ai00_like", "pull", "rwkv7-g1a-0.1b", "--dir", str(tmp_path / "models"),
                           "--quant", "1", "--quant-type", "nf4"], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, HF_ENDPOINT=hub.url, HF_HOME=str(tmp_path), HF_HUB_DISABLE_PROGRESS_BARS="1"))
    assert done.returncode == 0, done.stderr
    written = tmp_path / "models" / "rwkv7-g1a-0.1b-20250728-ctx4096.st"
    assert f'name = "{written.name}"' in done.stdout
    model = load_model(str(written))
    assert type(model.blocks[0].channel_mix.W["key"]).__name__ in ("PackedNF4", "PanelNF4")  # loads back quantised

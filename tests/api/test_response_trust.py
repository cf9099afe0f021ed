"""Stored responses on a shared or unlucky machine, each defect as it was found by probing:
another key's responses, deleted text that lived on in later records, a full disk after
the reply was made, a damaged or read-only store at start, two servers on one folder,
records that never expired, histories copied into every turn, and penalties that a
continuation forgot. Real servers, the openai SDK, a real tmpfs that fills up."""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import openai
import pytest

from ai00_like.messages import Failed
from ai00_like.response_store import Caller, StoreError
from ai00_like.response_store.store import ResponseStore
from api_helpers import InterceptedGenerates, ServerThread, config_for, write_model

GREEDY = {"temperature": 0, "max_output_tokens": 8}
KEYS = 'api_keys = ["sk-alice", "sk-bob"]\nadmin_key = "sk-admin"'
MODELS = Path(__file__).resolve().parents[2] / "assets" / "models"


def client(server, key: str = "unused", retries: int = 0) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url, api_key=key, max_retries=retries)


def store_section(folder: Path, extra: str = "") -> str:
    return f'[responses]\npath = "{folder}"\n{extra}'


@pytest.fixture(scope="module")
def keyed(model_dir):
    with ServerThread(config_for(model_dir, listen_extra=KEYS)) as server:
        yield server


# ------------------------------------------------------------------ ownership


def test_another_keys_response_is_not_found_in_any_way(keyed):
    alice, bob, admin = client(keyed, "sk-alice"), client(keyed, "sk-bob"), client(keyed, "sk-admin")
    secret = alice.responses.create(model="tiny", input="Hello, my secret is 1234", **GREEDY)
    with pytest.raises(openai.NotFoundError):
        bob.responses.retrieve(secret.id)
    with pytest.raises(openai.NotFoundError):
        bob.responses.input_items.list(secret.id)
    with pytest.raises(openai.NotFoundError) as refused:
        bob.responses.create(model="tiny", input="What was it?", previous_response_id=secret.id, **GREEDY)
    assert refused.value.body["param"] == "previous_response_id"
    with pytest.raises(openai.NotFoundError):
        bob.responses.delete(secret.id)
    # exactly as for an id that does not exist
    unknown = keyed.get("/v1/responses/resp_doesnotexist", headers={"Authorization": "Bearer sk-bob"})
    foreign = keyed.get(f"/v1/responses/{secret.id}", headers={"Authorization": "Bearer sk-bob"})
    assert (foreign.status, foreign.json()["error"]["code"]) == (unknown.status, unknown.json()["error"]["code"])
    # Alice still has it all, and the admin key sees everyone's.
    assert alice.responses.input_items.list(secret.id).data[0].content[0].text == "Hello, my secret is 1234"
    assert admin.responses.retrieve(secret.id).id == secret.id
    alice.responses.delete(secret.id)
    with pytest.raises(openai.NotFoundError):
        alice.responses.retrieve(secret.id)


def test_the_store_keeps_a_digest_of_the_key_not_the_key(keyed):
    made = client(keyed, "sk-alice").responses.create(model="tiny", input="Hi", **GREEDY)
    record = keyed.serving.responses.get(made.id, Caller(sees_all=True))
    assert record.owner.startswith("key:") and "sk-alice" not in record.owner


# ------------------------------------------------------------------ references, not copies


def test_deleting_a_response_deletes_its_text_from_the_conversation(keyed):
    alice = client(keyed, "sk-alice")
    store, tokenizer = keyed.serving.responses, keyed.serving.model.tokenizer
    secret = alice.responses.create(model="tiny", input="Hello, my secret is 1234", **GREEDY)
    later = alice.responses.create(model="tiny", input="And then?", previous_response_id=secret.id, **GREEDY)
    alice.responses.delete(secret.id)
    record = store.get(later.id, Caller(sees_all=True))
    assert "1234" not in tokenizer.decode(list(record.tokens)) and "1234" in tokenizer.decode(
        list(tokenizer.encode("Hello, my secret is 1234")))
    # The later turn goes on from its own state...
    alice.responses.create(model="tiny", input="More", previous_response_id=later.id, **GREEDY)
    # ...but once that is gone too, its conversation cannot be read again: a clear 400.
    (store.folder / "states" / f"{later.id}.npz").unlink()
    with pytest.raises(openai.BadRequestError) as e:
        alice.responses.create(model="tiny", input="More", previous_response_id=later.id, **GREEDY)
    assert e.value.body["code"] == "conversation_incomplete" and e.value.body["param"] == "previous_response_id"


def test_a_long_conversation_stores_each_turn_once(keyed):
    alice, store = client(keyed, "sk-alice"), keyed.serving.responses
    turns = [alice.responses.create(model="tiny", input="In the beginning " * 20, **GREEDY)]
    for _ in range(24):
        turns.append(alice.responses.create(model="tiny", input="And then? " * 10, previous_response_id=turns[-1].id,
                                            **GREEDY))
    records = [store.get(t.id, Caller(sees_all=True)) for t in turns]
    conversation = store.conversation(records[-1])
    # each turn's tokens once: the records add up to the conversation, not to its square
    assert sum(len(r.tokens) for r in records) == len(conversation)
    assert len(conversation) > 20 * len(records[0].tokens) / 2
    (store.folder / "states" / f"{turns[-1].id}.npz").unlink()  # rebuilt from the references
    with InterceptedGenerates(keyed.serving) as spy:
        alice.responses.create(model="tiny", input="End.", previous_response_id=turns[-1].id, **GREEDY)
    assert spy.sent[0].state is None and spy.sent[0].prefix == conversation + records[-1].tail


def test_an_empty_previous_response_id_is_refused(keyed):
    r = keyed.post("/v1/responses", {"model": "tiny", "input": "Hi", "previous_response_id": ""},
                   headers={"Authorization": "Bearer sk-alice"})
    assert r.status == 400 and r.json()["error"]["param"] == "previous_response_id"


# ------------------------------------------------------------------ the penalties' memory


def test_a_continuation_replies_as_the_explicit_history_does():
    """On the demo model with its default penalties (0.3/0.3, as Ai00's), greedy: continuing
    a stored response and sending the whole conversation give the same reply."""
    extra = f'[tokenizer]\npath = "{MODELS / "demo_vocab.txt"}"'
    with ServerThread(config_for(MODELS, extra, model="demo.st")) as server:
        c = client(server)
        options = {"model": "demo", "temperature": 0, "max_output_tokens": 40}
        first = c.responses.create(input="Who was Moses?", **options)
        second = c.responses.create(input="What did the LORD say to him?", previous_response_id=first.id, **options)
        history = [{"role": "user", "content": "Who was Moses?"},
                   *[item.model_dump(exclude_none=True) for item in first.output],
                   {"role": "user", "content": "What did the LORD say to him?"}]
        explicit = c.responses.create(input=history, **options)
        assert second.output_text == explicit.output_text
        third = c.responses.create(input="And then?", previous_response_id=second.id, **options)
        history += [*[item.model_dump(exclude_none=True) for item in second.output],
                    {"role": "user", "content": "And then?"}]
        assert third.output_text == c.responses.create(input=history, **options).output_text


# ------------------------------------------------------------------ bounds


def test_records_expire_and_keep_within_their_cap(tmp_path):
    write_model(tmp_path / "tiny.st")
    with ServerThread(config_for(tmp_path, store_section(tmp_path / "r", "ttl = 1"))) as server:
        made = client(server).responses.create(model="tiny", input="Hi", **GREEDY)
        assert client(server).responses.retrieve(made.id).id == made.id
        time.sleep(1.2)
        with pytest.raises(openai.NotFoundError):
            client(server).responses.retrieve(made.id)
    one = None
    with ServerThread(config_for(tmp_path, store_section(tmp_path / "r", "max_record_bytes = 6000"))) as server:
        made = [client(server).responses.create(model="tiny", input=f"Turn {i} " * 40, **GREEDY) for i in range(6)]
        kept = [m.id for m in made if server.serving.responses.get(m.id, Caller(), touch=False)]
        one = server.serving.responses.get(made[-1].id, Caller(), touch=False)
    assert kept and kept == [m.id for m in made[-len(kept):]] and len(kept) < 6  # the most recent ones
    assert one.size * len(kept) <= 6000 + one.size


# ------------------------------------------------------------------ a full disk


@contextlib.contextmanager
def tiny_tmpfs(where: Path, size: str = "512k"):
    where.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                             capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def fill(folder: Path, leave: int) -> Path:
    """A file that leaves about `leave` bytes free on folder's file system."""
    filler = folder / "filler"
    free = os.statvfs(folder).f_bavail * os.statvfs(folder).f_frsize
    with open(filler, "wb") as f:
        with contextlib.suppress(OSError):
            f.write(b"\0" * max(free - leave, 0))
    return filler


def test_a_full_disk_keeps_the_reply_and_says_it_was_not_stored(tmp_path):
    write_model(tmp_path / "tiny.st")
    with tiny_tmpfs(tmp_path / "disk") as disk, \
            ServerThread(config_for(tmp_path, store_section(disk / "responses"))) as server:
        c = client(server, retries=2)  # the SDK retries a 5xx: a failed store must not look like one
        stored = c.responses.create(model="tiny", input="Hi", **GREEDY)
        filler = fill(disk, leave=0)
        with InterceptedGenerates(server.serving) as spy:
            raw = c.responses.with_raw_response.create(model="tiny", input="Tell me of the flood.", **GREEDY)
        made = raw.parse()
        assert len(spy.sent) == 1 and raw.headers["x-ai00-store"] == "failed"
        assert made.output_text and made.store is False
        with pytest.raises(openai.NotFoundError):
            c.responses.retrieve(made.id)
        events = list(c.responses.create(model="tiny", input="Tell me of the flood.", stream=True, **GREEDY))
        assert events[-1].type in ("response.completed", "response.incomplete")
        assert events[-1].response.store is False
        assert events[-1].response.output_text == made.output_text
        assert not list((disk / "responses" / "states").glob("*.partial"))
        metrics = server.get("/metrics").body.decode()
        assert 'rwkv:response_store_failures_total{model_name="tiny"' in metrics
        filler.unlink()  # room again: stored as before
        again = c.responses.create(model="tiny", input="And then?", previous_response_id=stored.id, **GREEDY)
        assert c.responses.retrieve(again.id).id == again.id


def test_a_stream_whose_reply_fails_ends_with_an_error_event(keyed):
    """The reply fails after the stream began (the model was unloaded under it): the last
    event is `error`, never a stream that just stops."""
    answer = {}
    with InterceptedGenerates(keyed.serving, hold=True) as spy:
        asking = threading.Thread(target=lambda: answer.update(r=keyed.post(
            "/v1/responses", {"model": "tiny", "input": "Hi", "stream": True, **GREEDY},
            headers={"Authorization": "Bearer sk-alice"})))
        asking.start()
        assert spy.arrived.wait(30)
        time.sleep(0.5)  # past the first-event wait: the stream's headers and first events are out
        spy.sent[0].reply(Failed("The model was unloaded.", kind="unloaded"))
        asking.join(30)
    events = [json.loads(line[len("data: "):]) for line in answer["r"].body.decode().splitlines()
              if line.startswith("data: ")]
    assert answer["r"].status == 200 and events[0]["type"] == "response.created"
    assert events[-1]["type"] == "error" and "unloaded" in events[-1]["message"]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))


# ------------------------------------------------------------------ the store at start


def serve(config: Path, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ai00_like", "--config", str(config)], capture_output=True,
                          text=True, timeout=timeout)


def config_file(folder: Path, responses: Path, extra: str = "") -> Path:
    path = folder / "config.toml"
    path.write_text(f'[model]\npath = "{folder}"\nname = ""\n[listen]\nport = 0\n'
                    f'[responses]\npath = "{responses}"\n{extra}')
    return path


def test_a_damaged_store_stops_the_start_with_one_line_or_is_left_off(tmp_path):
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "responses.sqlite3").write_bytes(b"this is not a database, " * 100)
    result = serve(config_file(tmp_path, tmp_path / "r"))
    assert result.returncode != 0 and "Traceback" not in result.stderr
    [line] = [line for line in result.stderr.splitlines() if "responses.sqlite3" in line]
    assert "move the file away" in line and "[responses] store = false" in line
    write_model(tmp_path / "tiny.st")
    config = config_for(tmp_path, store_section(tmp_path / "r", "required = false"))
    with ServerThread(config) as server:
        made = client(server).responses.create(model="tiny", input="Hi", **GREEDY)
        assert made.store is False and made.output_text
        with pytest.raises(openai.NotFoundError) as e:
            client(server).responses.retrieve(made.id)
        assert "responses.sqlite3" in e.value.body["message"]
    assert (tmp_path / "r" / "responses.sqlite3").read_bytes().startswith(b"this is not")  # never overwritten


def test_a_read_only_store_is_one_line_naming_the_folder(tmp_path):
    with tiny_tmpfs(tmp_path / "ro") as disk:
        (disk / "responses" / "states").mkdir(parents=True)
        subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)
        existing = serve(config_file(tmp_path, disk / "responses"))
        missing = serve(config_file(tmp_path, disk / "elsewhere"))
    for result, folder in [(existing, disk / "responses"), (missing, disk / "elsewhere")]:
        assert result.returncode != 0 and "Traceback" not in result.stderr
        assert "cannot listen" not in result.stderr
        [line] = result.stderr.strip().splitlines()
        assert f"{folder}: " in line and "read-only" in line.lower() and "[responses]" in line


def test_a_second_server_on_the_same_folder_is_refused(tmp_path):
    write_model(tmp_path / "tiny.st")
    with ServerThread(config_for(tmp_path, store_section(tmp_path / "r"))) as server:
        made = client(server).responses.create(model="tiny", input="Hi", **GREEDY)
        result = serve(config_file(tmp_path, tmp_path / "r"))
        assert result.returncode != 0 and "Traceback" not in result.stderr
        assert f"in use by process {os.getpid()}" in result.stderr and "[store] url" in result.stderr
        with pytest.raises(StoreError):
            ResponseStore(tmp_path / "r", max_state_bytes=1 << 20, max_record_bytes=1 << 20, ttl=60)
        assert client(server).responses.retrieve(made.id).id == made.id  # nothing of it was touched
        assert (tmp_path / "r" / "states" / f"{made.id}.npz").exists()
    # once the first is gone, the folder is free again
    ResponseStore(tmp_path / "r", max_state_bytes=1 << 20, max_record_bytes=1 << 20, ttl=60).close()


def test_a_store_of_the_last_release_is_upgraded_in_place(tmp_path):
    folder = tmp_path / "r"
    (folder / "states").mkdir(parents=True)
    db = sqlite3.connect(folder / "responses.sqlite3")
    db.execute("CREATE TABLE responses (id TEXT PRIMARY KEY, model TEXT NOT NULL, fingerprint TEXT NOT NULL, "
               "created INTEGER NOT NULL, used REAL NOT NULL, response BLOB NOT NULL, input_items BLOB NOT NULL, "
               "tools BLOB NOT NULL, tokens BLOB NOT NULL, tail BLOB NOT NULL, state_bytes INTEGER NOT NULL)")
    db.execute("INSERT INTO responses VALUES ('resp_old', 'tiny', 'fp', 1, ?, x'7b7d', x'5b5d', x'5b5d', ?, x'', 0)",
               (time.time(), bytes([5, 0, 0, 0, 6, 0, 0, 0])))
    db.commit()
    db.close()
    store = ResponseStore(folder, max_state_bytes=1 << 20, max_record_bytes=1 << 20, ttl=60)
    try:
        assert store.get("resp_old", Caller(owner="key:someone")) is None  # who made it is not known
        record = store.get("resp_old", Caller())
        assert record.tokens == (5, 6) and store.conversation(record) == (5, 6)
    finally:
        store.close()


def test_a_store_with_saved_states_of_layout_2_gains_their_tools(tmp_path):
    folder = tmp_path / "r"
    ResponseStore(folder, max_state_bytes=1 << 20, max_record_bytes=1 << 20, ttl=60).close()
    db = sqlite3.connect(folder / "responses.sqlite3")
    db.execute("ALTER TABLE saved_states DROP COLUMN tools")  # as layout 2 made it
    db.execute("INSERT INTO saved_states VALUES ('state_old', 'anonymous', 'kept', 'tiny', 'fp', '7', 3, 8, 1, 1.0)")
    db.execute("PRAGMA user_version = 2")
    db.commit()
    db.close()
    store = ResponseStore(folder, max_state_bytes=1 << 20, max_record_bytes=1 << 20, ttl=60)
    try:
        record = store.saved.get("state_old", Caller())
        assert (record.name, record.tokens, record.tools) == ("kept", 3, "")  # saved before tools were kept
    finally:
        store.close()

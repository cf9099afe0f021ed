"""The shared store ([store] url = "redis://…") with Debian's real redis-server and server
replicas as separate processes, on the loopback: a response stored by one replica is read,
continued and deleted on another, which continues it from the stored RNN state (same reply,
only the new turn's tokens read); keys carry the prefix and the TTL; a replica serving other
weights never uses the state; Redis stopped gives 503 from the routes that need it and
nothing else, and Redis back works again without a restart. A saved state (POST
/v1/saved_states) made on one replica serves its key on another, and has no TTL. Plus the state blob's encoding
and the model identity, as units."""

from __future__ import annotations

import shutil
from contextlib import ExitStack

import httpx
import msgspec
import numpy as np
import openai
import pytest
from process_helpers import REDIS, RedisProcess, ServerProcess, process_config

from ai00_like.config import ConfigError, parse_config
from ai00_like.identity import file_identity
from ai00_like.response_store import StoredResponse
from ai00_like.response_store.state_blob import decode_state, encode_state
from ai00_like.rwkv.state import State
from api_helpers import replica_folders, write_model

PREFIX = "test-ai00:"
TTL = 3600
GREEDY = {"model": "tiny", "temperature": 0, "max_output_tokens": 8}


def replica(stack: ExitStack, folder, redis_url: str) -> ServerProcess:
    config = process_config(folder) + f'[store]\nurl = "{redis_url}"\nprefix = "{PREFIX}"\nttl = {TTL}\n'
    return stack.enter_context(ServerProcess(folder, config))


def client_of(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """Redis, replicas A and B of one model (its file copied to another path for B) and C,
    a replica of other weights under the same name."""
    if not shutil.which(REDIS):
        pytest.skip("redis-server is not installed (apt-get install redis-server)")
    root = tmp_path_factory.mktemp("shared")
    replica_folders(root)
    store = RedisProcess(root).start()
    with ExitStack() as stack:
        stack.callback(store.stop)
        a, b, c = (replica(stack, root / name, store.url) for name in "abc")
        yield store, client_of(a), client_of(b), client_of(c), (a, b, c)


def fingerprint_of(client: openai.OpenAI) -> str:
    chat = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Hi"}], max_tokens=1)
    return chat.system_fingerprint


# ---------------------------------------------------------------------------------- across replicas


def test_a_response_stored_on_one_replica_is_read_and_deleted_on_another(cluster):
    _, a, b, _, _ = cluster
    made = a.responses.create(input="Who made the light?", instructions="Answer briefly.", **GREEDY)
    assert b.responses.retrieve(made.id).model_dump() == made.model_dump()
    items = b.responses.input_items.list(made.id)
    assert [(i.type, i.role, i.content[0].text) for i in items.data] == [("message", "user", "Who made the light?")]
    b.responses.delete(made.id)
    for replica_client in (a, b):
        with pytest.raises(openai.NotFoundError):
            replica_client.responses.retrieve(made.id)


def test_another_replica_continues_from_the_stored_state(cluster):
    _, a, b, _, _ = cluster
    assert fingerprint_of(a) == fingerprint_of(b)  # one model, though its file lies elsewhere on B
    first = a.responses.create(input="Who built the ark?", **GREEDY)
    on_a = a.responses.create(input="And then?", previous_response_id=first.id, **GREEDY)
    on_b = b.responses.create(input="And then?", previous_response_id=first.id, **GREEDY)
    assert on_b.output_text == on_a.output_text and on_b.output_text
    # B read only the new turn, from the state A stored: not the conversation's tokens again.
    assert on_b.usage.input_tokens == on_a.usage.input_tokens
    assert on_b.usage.input_tokens < first.usage.input_tokens + first.usage.output_tokens
    # And a third turn on B from the second's state gives what it gives on A.
    third_b = b.responses.create(input="Why?", previous_response_id=on_b.id, **GREEDY)
    third_a = a.responses.create(input="Why?", previous_response_id=on_a.id, **GREEDY)
    assert third_b.output_text == third_a.output_text


def test_keys_carry_the_prefix_and_the_ttl_and_reading_refreshes_it(cluster):
    store, a, b, _, _ = cluster
    made = a.responses.create(input="Count the stars.", **GREEDY)
    r = store.client()
    keys = {k.decode() for k in r.keys(f"*{made.id}")}
    assert keys == {f"{PREFIX}response:{made.id}", f"{PREFIX}state:{made.id}"}
    for key in keys:
        assert 0 < r.ttl(key) <= TTL
        r.expire(key, 100)
    b.responses.retrieve(made.id)
    assert all(r.ttl(key) > TTL - 60 for key in keys)
    assert not [k for k in r.keys("*") if not k.decode().startswith(PREFIX)]


def test_a_replica_of_other_weights_never_uses_the_state(cluster):
    store, a, _, c, _ = cluster
    fp_a, fp_c = fingerprint_of(a), fingerprint_of(c)
    assert fp_a != fp_c
    first = a.responses.create(input="Who built the ark?", **GREEDY)
    on_a = a.responses.create(input="And then?", previous_response_id=first.id, **GREEDY)
    on_c = c.responses.create(input="And then?", previous_response_id=first.id, **GREEDY)
    # C read the whole stored conversation again (rebuilding the state with its own weights).
    history = first.usage.input_tokens + first.usage.output_tokens
    assert on_c.usage.input_tokens >= history + on_a.usage.input_tokens - 1
    # A record forged to claim C's model: the state blob still names A's, and is refused.
    r, key = store.client(), f"{PREFIX}response:{first.id}"
    record = msgspec.msgpack.decode(r.get(key), type=StoredResponse)
    r.set(key, msgspec.msgpack.encode(msgspec.structs.replace(record, fingerprint=fp_c)), keepttl=True)
    again = c.responses.create(input="And then?", previous_response_id=first.id, **GREEDY)
    assert (again.output_text, again.usage.input_tokens) == (on_c.output_text, on_c.usage.input_tokens)


def test_responses_belong_to_their_key_and_turns_reference_each_other(cluster, tmp_path):
    """The embedded store's rules hold in Redis too: another key's response is not found, a
    later turn keeps no copy of an earlier one, and storing a turn keeps its earlier ones."""
    store = cluster[0]
    write_model(tmp_path / "tiny.st")
    config = (process_config(tmp_path) + 'api_keys = ["sk-alice", "sk-bob"]\n'
              + f'[store]\nurl = "{store.url}"\nprefix = "{PREFIX}"\nttl = {TTL}\n')
    with ServerProcess(tmp_path, config) as server:
        alice, bob = (openai.OpenAI(base_url=server.base_url, api_key=key, max_retries=0, timeout=60)
                      for key in ("sk-alice", "sk-bob"))
        secret = alice.responses.create(input="Hello, my secret is 1234", **GREEDY)
        for ask in (bob.responses.retrieve, bob.responses.input_items.list, bob.responses.delete):
            with pytest.raises(openai.NotFoundError):
                ask(secret.id)
        with pytest.raises(openai.NotFoundError):
            bob.responses.create(input="What was it?", previous_response_id=secret.id, **GREEDY)
        r = store.client()

        def record_of(ident: str) -> StoredResponse:
            return msgspec.msgpack.decode(r.get(f"{PREFIX}response:{ident}"), type=StoredResponse)

        secret_tokens = record_of(secret.id).tokens
        r.expire(f"{PREFIX}response:{secret.id}", 100)
        later = alice.responses.create(input="And then?", previous_response_id=secret.id, **GREEDY)
        assert r.ttl(f"{PREFIX}response:{secret.id}") > TTL - 60  # the conversation lives on as a whole
        record = record_of(later.id)
        assert record.ancestors == (secret.id,) and record.tokens[:len(secret_tokens)] != secret_tokens
        alice.responses.delete(secret.id)
        r.delete(f"{PREFIX}state:{later.id}")  # as maxmemory would drop it
        with pytest.raises(openai.BadRequestError) as e:
            alice.responses.create(input="More", previous_response_id=later.id, **GREEDY)
        assert e.value.body["code"] == "conversation_incomplete"


def test_a_saved_state_made_on_one_replica_serves_its_key_on_another_and_never_expires(cluster, tmp_path):
    """POST /v1/saved_states on A; B lists it, starts a chat from it (the reply A gives),
    downloads the same file and deletes it, for the key that saved it; another key's every
    route is a 404. Its keys in Redis have no TTL, and using it gives them none."""
    store = cluster[0]
    servers, keys = [], ("sk-alice", "sk-bob")
    with ExitStack() as stack:
        for name in "ab":
            (tmp_path / name).mkdir()
            write_model(tmp_path / name / "tiny.st")
            config = (process_config(tmp_path / name) + f'api_keys = ["{keys[0]}", "{keys[1]}"]\n'
                      + f'[store]\nurl = "{store.url}"\nprefix = "{PREFIX}"\nttl = {TTL}\n')
            servers.append(stack.enter_context(ServerProcess(tmp_path / name, config)))
        a, b = (httpx.Client(base_url=f"http://127.0.0.1:{s.port}/v1", timeout=60,
                             headers={"Authorization": f"Bearer {keys[0]}"}) for s in servers)
        bob = {"Authorization": f"Bearer {keys[1]}"}
        system = {"role": "system", "content": "You answer from the Book of Genesis."}
        question = {"role": "user", "content": "Who made the light?"}
        made = a.post("/saved_states", json={"messages": [system], "name": "genesis"})
        assert made.status_code == 200, made.text
        ident = made.json()["id"]
        assert [s["id"] for s in b.get("/saved_states").json()["data"]] == [ident]
        assert b.get(f"/saved_states/{ident}").json() == made.json()
        r = store.client()
        owners = [k.decode() for k in r.keys(f"{PREFIX}saved_by:*")]
        assert len(owners) == 1 and "sk-alice" not in owners[0]  # the key's owner, not the key itself
        saved_keys = [f"{PREFIX}saved:{ident}", f"{PREFIX}saved_state:{ident}", owners[0]]
        assert all(r.exists(key) for key in saved_keys)

        def reply(client: httpx.Client, messages, state=None, **headers) -> httpx.Response:
            body = {"model": "tiny", "messages": messages, "temperature": 0, "max_tokens": 8}
            return client.post("/chat/completions", json={**body, **({"state": state} if state else {})},
                               headers=headers)

        whole = reply(a, [system, question]).json()["choices"][0]["message"]["content"]
        for client in (a, b):
            done = reply(client, [question], ident)
            assert done.status_code == 200, done.text
            assert done.json()["choices"][0]["message"]["content"] == whole
        assert b.get(f"/saved_states/{ident}").json()["last_used_at"] >= made.json()["last_used_at"]
        assert [r.ttl(key) for key in saved_keys] == [-1, -1, -1]  # kept until deleted, used or not
        content = b.get(f"/saved_states/{ident}/content")
        assert content.status_code == 200 and content.content == a.get(f"/saved_states/{ident}/content").content
        assert 'filename="genesis.st"' in content.headers["content-disposition"]
        for client in (a, b):
            assert client.get("/saved_states", headers=bob).json()["data"] == []
            for method, path in [("GET", ""), ("GET", "/content"), ("DELETE", "")]:
                refused = client.request(method, f"/saved_states/{ident}{path}", headers=bob)
                assert refused.status_code == 404 and refused.json()["error"]["code"] == "state_not_found", path
            refused = reply(client, [question], ident, **bob)
            assert refused.status_code == 404 and refused.json()["error"]["code"] == "state_not_found"
        assert b.delete(f"/saved_states/{ident}").json() == {"id": ident, "object": "saved_state.deleted",
                                                              "deleted": True}
        assert a.get(f"/saved_states/{ident}").status_code == 404
        assert not any(r.exists(key) for key in saved_keys)


def test_without_redis_only_the_store_routes_answer_503_and_it_comes_back(cluster, tmp_path):
    store, a, b, _, (server_a, _, _) = cluster
    kept = a.responses.create(input="Remember me.", **GREEDY)
    store.stop()
    try:
        http = httpx.Client(base_url=f"http://127.0.0.1:{server_a.port}", timeout=60)
        for method, path, body in [
            ("POST", "/v1/responses", {**GREEDY, "input": "Hi"}),
            ("POST", "/v1/responses", {**GREEDY, "input": "Hi", "store": False, "previous_response_id": kept.id}),
            ("GET", f"/v1/responses/{kept.id}", None),
            ("GET", f"/v1/responses/{kept.id}/input_items", None),
            ("DELETE", f"/v1/responses/{kept.id}", None),
        ]:
            reply = http.request(method, path, json=body)
            assert reply.status_code == 503, (path, reply.text)
            error = reply.json()["error"]
            assert error["code"] == "store_unavailable" and store.url in error["message"], error
            assert "Traceback" not in reply.text
        # The model serves everything that needs no store.
        assert http.get("/health").status_code == 200
        assert a.responses.create(input="Hi", store=False, **GREEDY).output_text
        assert a.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Hi"}],
                                         max_tokens=2).choices[0].message.content is not None
        # A replica started while the store is down starts, and says why it will answer 503.
        (tmp_path / "tiny.st").symlink_to(server_a.path.parent / "tiny.st")
        with ExitStack() as stack:
            late = replica(stack, tmp_path, store.url)
            assert "unavailable" in "".join(line for line in late.lines if "response store" in line)
            store.start()  # the same port, empty: a restart without persistence
            made = client_of(late).responses.create(input="Back again?", **GREEDY)
        assert b.responses.retrieve(made.id).output_text == made.output_text
        assert a.responses.create(input="More", previous_response_id=made.id, **GREEDY).output_text
    finally:
        if store.proc.poll() is not None:
            store.start()


# ---------------------------------------------------------------------------------- units


def _state(seed: int = 0) -> State:
    rng = np.random.default_rng(seed)
    return State(rng.standard_normal((2, 64), np.float32), rng.standard_normal((2, 2, 32, 32), np.float32),
                 rng.standard_normal((2, 64), np.float32))


def test_a_state_blob_round_trips_and_names_its_model():
    state = _state()
    blob = encode_state(state, "fp_one")
    assert len(blob) < state.att_shift.nbytes + state.wkv.nbytes + state.ffn_shift.nbytes + 100
    back = decode_state(blob, "fp_one")
    for got, want in zip(back.parts(), state.parts()):
        assert got.dtype == want.dtype and got.shape == want.shape and np.array_equal(got, want)
    back.wkv[0, 0, 0, 0] = 7.0  # the engine may write into a state it is given
    assert decode_state(blob, "fp_two") is None  # another model's state is never used
    for damaged in (b"", b"not a state", blob[:-4], blob[:20]):
        with pytest.raises(ValueError):
            decode_state(damaged, "fp_one")


def test_the_model_identity_follows_the_content_not_the_path(tmp_path):
    (tmp_path / "x").mkdir()
    one = write_model(tmp_path / "tiny.st")
    shutil.copy(one, tmp_path / "x" / "tiny.st")
    other = write_model(tmp_path / "x" / "other.st", seed=4)
    assert file_identity(one) == file_identity(tmp_path / "x" / "tiny.st")
    assert file_identity(one).split(":")[2] != file_identity(other).split(":")[2]


@pytest.mark.parametrize("url,message", [
    ("http://127.0.0.1:6379", "got scheme 'http'"),
    ("redis:///0", "got no host"),
    ("redis://:secret@host:port/0", "not a valid URL"),
])
def test_a_bad_store_url_is_one_line_naming_the_key(url, message):
    with pytest.raises(ConfigError) as e:
        parse_config(f'[store]\nurl = "{url}"\n')
    text = str(e.value)
    assert "store.url" in text and message in text and "\n" not in text and "secret" not in text
    assert parse_config('[store]\nurl = "rediss://user:pw@cache.example:6380/2"\n').store.ttl == 30 * 86400

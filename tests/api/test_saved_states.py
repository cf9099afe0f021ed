"""Named conversation states (/v1/saved_states) through the real server: saved from text or
chat messages, started from by chat, completions and the Responses API through the openai
SDK (`extra_body={"state": id}`), kept across a restart, exported as the `.st`/`.pth` files
state-tuning tools read and imported on another server; each key sees only its own.

The tiny synthetic model's replies are gibberish but deterministic under greedy decoding,
so "the same reply" is exact.
"""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import openai
import pytest
import requests

from ai00_like.rwkv import load_state
from ai00_like.rwkv.formats.safetensors import write_safetensors
from ai00_like.rwkv.state_file import read_state
from ai00_like.rwkv.synthetic import make_state
from api_helpers import ServerThread, config_for, write_model

KEY, OTHER = "key-one", "key-two"
KEYS = f'api_keys = ["{KEY}", "{OTHER}"]'
GREEDY = {"temperature": 0, "max_tokens": 12}
SYSTEM = {"role": "system", "content": "You are a careful scribe of the old books."}
QUESTION = {"role": "user", "content": "Who made the light?"}
DOCUMENT = "In the beginning God created the heaven and the earth.\n\nAnd the earth was without form."


def auth(key: str = KEY) -> dict:
    return {"Authorization": f"Bearer {key}"}


def server_for(folder: Path, responses: Path, *, seed: int = 3, extra: str = "") -> ServerThread:
    write_model(folder / "tiny.st", seed=seed)
    store = extra or f'[responses]\npath = "{responses}"\n'
    return ServerThread(config_for(folder, store, listen_extra=KEYS))


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with server_for(tmp_path_factory.mktemp("saved-model"), tmp_path_factory.mktemp("saved-store")) as s:
        yield s


def sdk(server, key: str = KEY) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url, api_key=key, max_retries=0)


def save(server, key: str = KEY, **body) -> dict:
    reply = server.post("/v1/saved_states", body, headers=auth(key))
    assert reply.status == 200, reply
    return reply.json()


def chat(server, messages, state: str | None = None, key: str = KEY, **kw) -> str:
    extra = {"state": state} if state else None
    done = sdk(server, key).chat.completions.create(model="tiny", messages=messages, extra_body=extra,
                                                    **{**GREEDY, **kw})
    return done.choices[0].message.content


def test_save_list_get_delete(server):
    made = save(server, input=DOCUMENT, name="genesis")
    assert made["id"].startswith("state_") and made["object"] == "saved_state"
    assert made["name"] == "genesis" and made["model"] == "tiny"
    assert made["tokens"] > 5 and made["bytes"] > 0 and made["last_used_at"] >= made["created_at"] > 0
    listed = server.get("/v1/saved_states", headers=auth()).json()
    assert listed["object"] == "list" and made["id"] in [s["id"] for s in listed["data"]]
    assert server.get(f"/v1/saved_states/{made['id']}", headers=auth()).json() == made
    gone = server.request("DELETE", f"/v1/saved_states/{made['id']}", headers=auth())
    assert gone.status == 200 and gone.json() == {"id": made["id"], "object": "saved_state.deleted", "deleted": True}
    missing = server.get(f"/v1/saved_states/{made['id']}", headers=auth())
    assert missing.status == 404 and missing.json()["error"]["code"] == "state_not_found"
    assert made["id"] not in [s["id"] for s in server.get("/v1/saved_states", headers=auth()).json()["data"]]


def test_a_chat_from_saved_messages_replies_as_the_whole_chat(server):
    made = save(server, messages=[SYSTEM])
    alone = chat(server, [SYSTEM, QUESTION])
    assert chat(server, [QUESTION], made["id"]) == alone
    assert chat(server, [QUESTION]) != alone  # the state is what makes the difference
    second = sdk(server).chat.completions.create(model="tiny", messages=[QUESTION], extra_body={"state": made["id"]},
                                                 **GREEDY)
    assert second.choices[0].message.content == alone
    assert second.usage.prompt_tokens_details.cached_tokens > 0  # one prefix-cache partition per saved state
    again = server.get(f"/v1/saved_states/{made['id']}", headers=auth()).json()
    assert again["last_used_at"] >= made["last_used_at"]


def test_a_completion_from_saved_input_replies_as_the_whole_prompt(server):
    head, tail = DOCUMENT.split("\n\n")
    made = save(server, input=head + "\n\n")
    client = sdk(server)
    whole = client.completions.create(model="tiny", prompt=DOCUMENT, **GREEDY).choices[0].text
    from_state = client.completions.create(model="tiny", prompt=tail, extra_body={"state": made["id"]},
                                           **GREEDY).choices[0].text
    assert from_state == whole


def test_a_fork_extends_a_saved_state(server):
    base = save(server, messages=[SYSTEM])
    fork = save(server, messages=[QUESTION, {"role": "assistant", "content": "God did."}], state=base["id"])
    assert fork["tokens"] > base["tokens"]
    follow = {"role": "user", "content": "And then?"}
    whole = chat(server, [SYSTEM, QUESTION, {"role": "assistant", "content": "God did."}, follow])
    assert chat(server, [follow], fork["id"]) == whole


TOOLS = [{"type": "function", "function": {"name": "find_verse", "description": "Look a verse up by its words.",
                                          "parameters": {"type": "object", "properties": {"words": {"type": "string"}},
                                                         "required": ["words"]}}}]
CALLED = [{"role": "assistant", "content": None, "tool_calls": [
    {"id": "call_1", "type": "function", "function": {"name": "find_verse", "arguments": '{"words": "light"}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "Genesis 1:3"}]


def test_a_chat_from_a_saved_prompt_with_tools_replies_as_the_whole_chat(server):
    head, follow = [SYSTEM, QUESTION, *CALLED], [{"role": "user", "content": "And then?"}]
    made = save(server, messages=head, tools=TOOLS)
    whole = chat(server, head + follow, tools=TOOLS)
    assert chat(server, follow, made["id"], tools=TOOLS) == whole  # the tools are not announced twice
    bare = save(server, messages=head)
    assert chat(server, follow, bare["id"], tools=TOOLS) != whole  # without them it read another prompt
    unsaid = save(server, messages=head, tools=TOOLS, tool_choice="none")  # chat's "none": not in the prompt
    assert chat(server, follow, unsaid["id"]) == chat(server, head + follow)
    fork = save(server, messages=follow, tools=TOOLS, state=made["id"])
    assert fork["tokens"] - made["tokens"] == save(server, messages=follow, state=bare["id"])["tokens"] - bare["tokens"]
    refused = server.post("/v1/saved_states", {"input": DOCUMENT, "tools": TOOLS}, headers=auth())
    assert refused.status == 400 and refused.json()["error"]["param"] == "tools", refused
    unknown = server.post("/v1/saved_states", {"messages": head, "tools": TOOLS,
                                               "tool_choice": {"type": "function", "function": {"name": "nope"}}},
                          headers=auth())
    assert unknown.status == 400 and unknown.json()["error"]["param"] == "tool_choice.function.name", unknown


def test_n_2_and_concurrent_requests_start_from_one_state(server):
    made = save(server, messages=[SYSTEM])
    alone = chat(server, [SYSTEM, QUESTION])
    done = sdk(server).chat.completions.create(model="tiny", messages=[QUESTION], n=2,
                                               extra_body={"state": made["id"]}, **GREEDY)
    assert [c.message.content for c in done.choices] == [alone, alone]
    replies: list[str] = []
    threads = [threading.Thread(target=lambda: replies.append(chat(server, [QUESTION], made["id"])))
               for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert replies == [alone, alone]


def test_the_responses_api_starts_from_a_saved_state(server):
    made = save(server, messages=[SYSTEM])
    client = sdk(server)
    whole = client.responses.create(model="tiny", input=[SYSTEM, QUESTION], temperature=0, max_output_tokens=12)
    started = client.responses.create(model="tiny", input=[QUESTION], temperature=0, max_output_tokens=12,
                                      extra_body={"state": made["id"]})
    assert started.output_text == whole.output_text
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(model="tiny", input="Hi", previous_response_id=whole.id,
                                extra_body={"state": made["id"]})
    assert refused.value.body["param"] == "state"


def test_another_keys_state_is_not_found_anywhere(server):
    made = save(server, input=DOCUMENT)
    for method, path in [("GET", ""), ("GET", "/content"), ("DELETE", "")]:
        reply = server.request(method, f"/v1/saved_states/{made['id']}{path}", headers=auth(OTHER))
        assert reply.status == 404 and reply.json()["error"]["code"] == "state_not_found", (method, path)
    assert made["id"] not in [s["id"] for s in server.get("/v1/saved_states", headers=auth(OTHER)).json()["data"]]
    with pytest.raises(openai.NotFoundError) as refused:
        chat(server, [QUESTION], made["id"], key=OTHER)
    assert refused.value.body["code"] == "state_not_found"
    assert server.get(f"/v1/saved_states/{made['id']}", headers=auth()).status == 200  # still there for its owner
    unknown = server.get("/v1/saved_states/state_0123456789abcdef", headers=auth())
    assert unknown.status == 404 and unknown.json()["error"]["code"] == "state_not_found"
    with pytest.raises(openai.NotFoundError):
        chat(server, [QUESTION], "state_0123456789abcdef")


def test_export_loads_through_the_state_file_reader(server, tmp_path):
    made = save(server, messages=[SYSTEM], name="scribe prompt")
    reply = server.get(f"/v1/saved_states/{made['id']}/content", headers=auth())
    assert reply.status == 200 and 'filename="scribe_prompt.st"' in reply.headers["content-disposition"]
    (tmp_path / "scribe.st").write_bytes(reply.body)
    info = server.serving.model.info
    whole = read_state(tmp_path / "scribe.st", info)
    tuned = load_state(tmp_path / "scribe.st", info)  # what [[state]] does with the file
    np.testing.assert_array_equal(tuned.wkv, whole.wkv)
    assert np.abs(whole.att_shift).sum() > 0  # the shift vectors came along
    pth = server.get(f"/v1/saved_states/{made['id']}/content?format=pth", headers=auth())
    assert pth.status == 200 and 'filename="scribe_prompt.pth"' in pth.headers["content-disposition"]
    (tmp_path / "scribe.pth").write_bytes(pth.body)
    torch = pytest.importorskip("torch")
    loaded = torch.load(tmp_path / "scribe.pth", weights_only=True)
    np.testing.assert_array_equal(loaded["blocks.0.att.time_state"].numpy(),
                                  read_state(tmp_path / "scribe.pth", info).wkv[0])  # v7: value-major as stored
    bad = server.get(f"/v1/saved_states/{made['id']}/content?format=zip", headers=auth())
    assert bad.status == 400 and bad.json()["error"]["param"] == "format"


def test_import_refuses_what_is_not_a_state_of_this_model(server, tmp_path):
    write_safetensors(make_state(2, 64, 16), tmp_path / "heads.st", dtype="fp32")  # 4 heads of 16; it has 2 of 32
    wrong = server.post("/v1/saved_states/import?model=tiny", (tmp_path / "heads.st").read_bytes(),
                        headers={**auth(), "Content-Type": "application/octet-stream"})
    assert wrong.status == 400, wrong
    assert "blocks.0.att.time_state" in wrong.json()["error"]["message"]
    assert "(2, 32, 32)" in wrong.json()["error"]["message"]
    garbage = server.post("/v1/saved_states/import", b"this is no state file at all" * 10,
                          headers={**auth(), "Content-Type": "application/octet-stream"})
    assert garbage.status == 400 and garbage.json()["error"]["param"] == "file", garbage


def test_a_restart_an_export_and_another_model(tmp_path):
    store, models = tmp_path / "store", [tmp_path / name for name in ("first", "again", "fresh", "other")]
    for folder in models:
        folder.mkdir()
    with server_for(models[0], store) as first:
        made = save(first, messages=[SYSTEM], name="kept")
        reply = chat(first, [QUESTION], made["id"])
        exported = first.get(f"/v1/saved_states/{made['id']}/content", headers=auth()).body
    with server_for(models[1], store) as again:  # the same store folder, a new process's view of it
        listed = again.get("/v1/saved_states", headers=auth()).json()["data"]
        assert made["id"] in [s["id"] for s in listed]
        assert chat(again, [QUESTION], made["id"]) == reply
    with server_for(models[2], tmp_path / "fresh-store") as fresh:
        assert fresh.get("/v1/saved_states", headers=auth()).json()["data"] == []
        raw = fresh.post("/v1/saved_states/import?model=tiny&name=moved", exported,
                         headers={**auth(), "Content-Type": "application/octet-stream"})
        assert raw.status == 200 and raw.json()["name"] == "moved", raw
        assert raw.json()["id"] != made["id"]
        assert chat(fresh, [QUESTION], raw.json()["id"]) == reply
        form = requests.post(f"{fresh.base_url}/saved_states/import", headers=auth(), timeout=60,
                             files={"file": ("kept.st", exported, "application/octet-stream")})
        assert form.status_code == 200, form.text
        assert chat(fresh, [QUESTION], form.json()["id"]) == reply
    with server_for(models[3], store, seed=4) as other:  # other weights under the same name
        with pytest.raises(openai.BadRequestError) as refused:
            chat(other, [QUESTION], made["id"])
        assert refused.value.body["param"] == "state" and refused.value.body["code"] == "state_model_mismatch"


def test_without_a_store_the_routes_say_what_to_turn_on(tmp_path):
    with server_for(tmp_path, tmp_path, extra="[responses]\nstore = false\n") as s:
        reply = s.post("/v1/saved_states", {"input": DOCUMENT}, headers=auth())
        assert reply.status == 400 and reply.json()["error"]["code"] == "store_disabled"
        assert "[responses] store = true" in reply.json()["error"]["message"]
        assert s.get("/v1/saved_states", headers=auth()).status == 400

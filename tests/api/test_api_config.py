"""config.toml, the `ai00-like` command, and how the server starts and answers without a model."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tomllib
from pathlib import Path

import msgspec
import openai
import pytest

from ai00_like.cli import main
from ai00_like.config import Config, ConfigError, load_config, parse_config
from api_helpers import SCHEMAS, ServerThread, config_for, write_model
from process_helpers import free_port

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "config.toml"


def _documented_keys(text: str) -> set[str]:
    """Keys set or shown (commented out) in the file, as "section.key"."""
    keys, section = set(), ""
    for line in text.splitlines():
        line = line.lstrip("# ").strip()
        if m := re.fullmatch(r"\[\[?(\w+)\]?\]", line):
            section = m.group(1)
        elif m := re.match(r"(\w+)\s*=", line):
            keys.add(f"{section}.{m.group(1)}")
    return keys


def _struct_keys(struct: type, prefix: str = "") -> set[str]:
    keys = set()
    for field in msgspec.structs.fields(struct):
        if field.name in ("base_dir", "source"):
            continue  # not keys of the file
        inner = field.type
        args = getattr(inner, "__args__", ())
        nested = next((a for a in (inner, *args) if isinstance(a, type) and issubclass(a, msgspec.Struct)), None)
        if nested is not None:
            keys |= _struct_keys(nested, field.name)
        else:
            keys.add(f"{prefix}.{field.name}")
    return keys


def test_shipped_config_documents_every_key_and_nothing_else():
    text = SHIPPED.read_text()
    config = parse_config(text, source="config.toml", base_dir=ROOT)
    assert config.model.name == "demo.st" and config.model_file == ROOT / "assets/models/demo.st"
    assert config.listen.ip == "127.0.0.1" and config.listen.port == 65530
    assert _documented_keys(text) == _struct_keys(Config)
    # Each key is explained: a comment opens the paragraph its line is in.
    for paragraph in text.split("\n\n"):
        lines = [line for line in paragraph.splitlines() if not re.fullmatch(r"#?\s*\[\[?\w+\]\]?", line)]
        if any(re.match(r"#?\s*\w+\s*=", line) for line in lines):
            assert lines[0].startswith("# "), paragraph
    tomllib.loads(text)


def test_every_section_of_the_shipped_config_loads_when_uncommented(tmp_path):
    text = "\n".join(line[2:] if re.match(r"# (\[\[?\w+\]\]?$|\w+\s*=)", line) else line
                     for line in SHIPPED.read_text().splitlines())
    config = parse_config(text, source="config.toml", base_dir=ROOT)
    assert config.state[0].name == "x060-3B" and config.lora[0].alpha == 192 and config.web is not None
    spec = config.model_spec()
    assert spec.states[0].id == "fd7a60ed-7807-449f-8256-bccae3246222" and spec.loras[0].path.endswith(".lora")


@pytest.mark.parametrize("text,message", [
    ("[model]\nmax_batch = 0", "model.max_batch: expected `int` >= 1"),
    ("[model]\nmax_bacth = 4", "model.max_bacth: unknown key"),
    ("[listen]\nport = 70000", "listen.port: expected `int` <= 65535"),
    ("[listen]\nport = \"80\"", "listen.port: expected `int`, got `str`"),
    ("[model]\ndevice = \"tpu\"", "model.device: unknown device 'tpu'"),
    ("[model\nname = 1", "not valid TOML"),
    ("[[state]]\nname = \"x\"", "state[0]: object missing required field `path`"),
    ("[[state]]\npath = \"a\"\nid = \"nope\"", "state[0].id: not a UUID"),
    ("[[state]]\npath = \"a\"\ndefault = true\n[[state]]\npath = \"b\"\ndefault = true", "more than one"),
    ("[model]\nname = \"../../etc/passwd\"", "model.name: must be a file inside"),
    ("surprise = 1", "surprise: unknown key"),
])
def test_bad_config_is_one_line_naming_the_key(text, message):
    with pytest.raises(ConfigError) as e:
        parse_config(text, source="bad.toml")
    assert str(e.value).startswith("bad.toml: ") and message in str(e.value) and "\n" not in str(e.value)


def test_cli_bad_config_exits_2_with_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.toml"
    bad.write_text("[model]\nmax_batch = -1\n")
    assert main(["--config", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"ai00-like: error: {bad}: model.max_batch: expected `int` >= 1"
    assert main(["--config", str(tmp_path / "missing.toml")]) == 2
    assert "missing.toml: no such file" in capsys.readouterr().err


def test_ai00_only_keys_are_accepted_and_reported(caplog):
    config = parse_config('[model]\nmodel_path = "m"\nquant = 0\nquant_type = "Int8"\nprecision = "Fp16"\n'
                          '[listen]\nslot = "permisionkey"\nforce_pass = true\n[bnf]\nenable_bytes_cache = true\n'
                          '[adapter]\nAuto = {}\n', source="ai00.toml")
    assert config.model.path == "m"
    reported = {m.split(": ")[1].split(" ")[0] for m in caplog.messages}
    assert {"listen.force_pass", "bnf", "adapter"} <= reported
    # quantisation and precision are ours too now, under Ai00's names and spellings
    assert not {"model.quant", "model.quant_type", "model.precision"} & reported
    spec = parse_config('[model]\nname = "m.st"\nquant = 4\nquant_type = "NF4"\nprecision = "Fp32"\ndevice = "1"\n'
                        ).model_spec()
    assert (spec.quant, spec.quant_type, spec.precision, spec.device) == (4, "NF4", "Fp32", "1")


@pytest.mark.parametrize("line, key", [('quant_type = "SF4"', "model.quant_type"), ('precision = "fp8"', "model.precision"),
                                       ("quant = -2", "model.quant")])
def test_bad_model_options_name_the_key(line, key):
    with pytest.raises(ConfigError, match=f"^c.toml: {key}: "):
        parse_config(f"[model]\n{line}\n", source="c.toml")


def test_state_ids_are_stable_across_starts():
    text = '[[state]]\npath = "a.state"\n'
    assert parse_config(text).state[0].id == parse_config(text).state[0].id


def test_relative_paths_follow_the_config_file(tmp_path):
    (tmp_path / "conf").mkdir()
    path = tmp_path / "conf" / "c.toml"
    path.write_text('[model]\npath = "models"\nname = "m.st"\n[tokenizer]\npath = "tok.json"\n')
    spec = load_config(path).model_spec()
    assert spec.path == str(tmp_path / "conf" / "models" / "m.st")
    assert spec.tokenizer == str(tmp_path / "conf" / "tok.json")


# ------------------------------------------------------------------------------ no model, API keys


def test_without_a_model_the_server_starts_and_answers_503(tmp_path):
    with ServerThread(config_for(tmp_path, model="missing.st")) as server:
        assert server.serving.last_error and "missing.st" in server.serving.last_error
        listed = server.get("/v1/models")
        SCHEMAS.check("ListModelsResponse", listed.json())
        assert listed.json()["data"] == []
        for path, body in [("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
                           ("/v1/completions", {"prompt": "hi"}), ("/v1/embeddings", {"input": "hi"})]:
            r = server.post(path, body)
            assert r.status == 503 and "retry-after" in r.headers
            SCHEMAS.check("ErrorResponse", r.json())
            assert "missing.st" in r.json()["error"]["message"]
        client = openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0)
        with pytest.raises(openai.InternalServerError) as e:
            client.chat.completions.create(model="missing", messages=[{"role": "user", "content": "hi"}])
        assert e.value.status_code == 503
        with pytest.raises(openai.NotFoundError):  # a name no model answers to
            client.chat.completions.create(model="x", messages=[{"role": "user", "content": "hi"}])
        # A model appears later (as through the admin route): requests are served.
        write_model(tmp_path / "missing.st")
        server.call(server.serving.load(server.config.model_spec()))
        assert server.post("/v1/completions", {"prompt": "hi", "max_tokens": 2}).status == 200


def test_api_keys_guard_the_openai_routes(tmp_path):
    write_model(tmp_path / "tiny.st")
    listen = 'api_keys = ["sk-one", "sk-two"]\ncors_origins = ["http://example"]'
    with ServerThread(config_for(tmp_path, listen_extra=listen)) as server:
        denied = server.get("/v1/models")
        assert denied.status == 401 and denied.json()["error"]["code"] == "invalid_api_key"
        SCHEMAS.check("ErrorResponse", denied.json())
        assert server.get("/v1/models", headers={"Authorization": "Bearer sk-wrong"}).status == 401
        non_ascii = "Bearer sk-\u00e9t\u00e9".encode("latin-1")
        assert server.get("/v1/models", headers={"Authorization": non_ascii}).status == 401
        assert server.get("/api/oai/models", headers={"Authorization": "Bearer sk-two"}).status == 200
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=server.base_url, api_key="sk-nope", max_retries=0).models.list()
        assert openai.OpenAI(base_url=server.base_url, api_key="sk-one").models.list().data[0].id == "tiny"
        # Browsers' CORS preflight carries no key and must pass.
        pre = server.request("OPTIONS", "/v1/chat/completions", headers={
            "Origin": "http://example", "Access-Control-Request-Method": "POST"})
        assert pre.status == 204 and pre.headers["access-control-allow-origin"] == "http://example"


def test_web_page_is_served_from_a_folder_or_zip(tmp_path):
    import zipfile

    write_model(tmp_path / "tiny.st")
    www = tmp_path / "www"
    www.mkdir()
    (www / "index.html").write_text("<h1>chat</h1>")
    with zipfile.ZipFile(tmp_path / "index.zip", "w") as z:
        z.writestr("index.html", "<h1>zipped</h1>")
        z.writestr("js/app.js", "let a = 1;")
    for path, expected in [("www", b"<h1>chat</h1>"), ("index.zip", b"<h1>zipped</h1>")]:
        with ServerThread(config_for(tmp_path, f'[web]\npath = "{tmp_path / path}"\n')) as server:
            assert server.get("/").body == expected
            assert server.get("/v1/models").status == 200  # the API wins over the page
            assert server.get("/../../etc/passwd").status == 404
    with ServerThread(config_for(tmp_path, f'[web]\npath = "{tmp_path / "index.zip"}"\n')) as server:
        assert server.get("/js/app.js").body == b"let a = 1;"


def test_the_pages_modules_are_all_served_as_javascript(tmp_path):
    """Browsers run a `<script type="module">` only when it comes with a JavaScript type. From
    the page's entry module, every module it imports (by "./name.js") is there and served so,
    and none of assets/www's modules is left out."""
    write_model(tmp_path / "tiny.st")
    www = ROOT / "assets" / "www"
    with ServerThread(config_for(tmp_path, f'[web]\npath = "{www}"\n')) as server:
        index = server.get("/").body.decode()
        assert server.get("/").headers["content-type"].startswith("text/html")
        todo = re.findall(r'<script type="module" src="([\w.-]+\.js)"', index)
        assert todo, "index.html loads no module"
        served = set()
        while todo:
            name = todo.pop()
            if name in served:
                continue
            r = server.get("/" + name)
            assert r.status == 200, name
            assert r.headers["content-type"].split(";")[0] == "text/javascript", (name, r.headers["content-type"])
            served.add(name)
            todo += re.findall(r'from\s+"\./([\w.-]+\.js)"', r.body.decode())
        assert served == {p.name for p in www.glob("*.js")}
        assert server.get("/app.css").headers["content-type"].startswith("text/css")


# ------------------------------------------------------------------------------ the command


def test_ai00_like_without_a_command_serves(tmp_path):
    (tmp_path / "config.toml").write_text('[model]\npath = "models"\nname = "absent.st"\n')
    port = free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "ai00_like", "--port", str(port)], cwd=tmp_path,
                            stderr=subprocess.PIPE, text=True, env=env)
    try:
        lines = []
        for line in proc.stderr:  # the server says when it listens
            lines.append(line)
            if "listening on" in line:
                break
        assert f"127.0.0.1:{port}" in lines[-1], lines
        import http.client

        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        conn.request("GET", "/v1/models")
        assert conn.getresponse().status == 200
        conn.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        rest = proc.stderr.read()  # to the end: the process has exited
        proc.wait(30)
    assert proc.returncode == 0, rest
    assert "absent.st not found" in "".join(lines) + rest


@pytest.mark.skipif(not (ROOT / "assets/models/demo.st").exists(), reason="the demo model is not in this checkout")
def test_the_shipped_config_serves_the_demo_model():
    config = load_config(SHIPPED)
    config.listen.port = 0
    with ServerThread(config) as server:
        assert server.serving.model is not None, server.serving.last_error
        client = openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0)
        reply = client.chat.completions.create(model="demo", messages=[{"role": "user", "content": "Who was Ruth?"}],
                                               max_tokens=40, temperature=0)
        choice = reply.choices[0]
        assert choice.message.content.strip() and "\n\n" not in choice.message.content
        assert choice.finish_reason in ("stop", "length")


def test_model_ids_may_contain_slashes(tmp_path):
    write_model(tmp_path / "tiny.st")
    with ServerThread(config_for(tmp_path, 'served_name = "RWKV/rwkv-tiny"')) as server:
        assert server.get("/v1/models").json()["data"][0]["id"] == "RWKV/rwkv-tiny"
        assert server.get("/v1/models/RWKV/rwkv-tiny").json()["id"] == "RWKV/rwkv-tiny"
        assert server.get("/v1/models/RWKV/other").json()["error"]["code"] == "model_not_found"
        client = openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0)
        assert client.chat.completions.create(model="RWKV/rwkv-tiny", messages=[{"role": "user", "content": "hi"}],
                                              max_tokens=1).model == "RWKV/rwkv-tiny"


def test_the_prefix_cache_on_disk_outlives_a_restart(tmp_path):
    write_model(tmp_path / "tiny.st")
    config = config_for(tmp_path, '[cache]\npath = "states"\ndisk_bytes = "64 MiB"\n')  # beside config.toml
    prompt = "Once upon a time " + " ".join(f"w{i}" for i in range(200))
    body = {"model": "tiny", "prompt": prompt, "max_tokens": 6, "temperature": 0}
    replies = []
    for _ in range(2):  # two servers, one after the other, on the same folder
        with ServerThread(config) as server:
            replies.append(msgspec.json.decode(server.post("/v1/completions", body).body))
    first, second = replies
    assert first["usage"]["prompt_tokens"] > 400
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] == first["usage"]["prompt_tokens"]
    assert second["choices"][0]["text"] == first["choices"][0]["text"]
    assert list((tmp_path / "states").glob("*/*.pcs"))


def test_cache_disk_bytes_is_checked():
    assert parse_config('[cache]\ndisk_bytes = "2 GiB"\n').disk_cache().max_bytes == 2 << 30
    assert parse_config('[cache]\ndisk_bytes = 0\n').disk_cache() is None
    assert parse_config('[cache]\nenabled = false\n').disk_cache() is None
    with pytest.raises(ConfigError, match=r"^c.toml: cache.disk_bytes: must be bytes"):
        parse_config('[cache]\ndisk_bytes = "lots"\n', source="c.toml")

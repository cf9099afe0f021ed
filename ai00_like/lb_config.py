"""`ai00-like lb-config`: a ready haproxy.cfg for replicas of this server.

For an RNN server, routing decides speed: a conversation that comes back to the replica
holding its state (in the prefix cache) costs only its new turn. HAProxy routes by a
consistent hash of an affinity key, the first of these that the request has:

1. `prompt_cache_key` in the JSON body (OpenAI's field for exactly this);
2. the `X-Session-Id` header;
3. `user` in the JSON body;
4. the conversation's first message (chat `messages[0].content`, or the Responses
   API's `input`), the same on every turn of one conversation.

`hash-type consistent` moves only a removed or added replica's share of conversations.
Replicas are health-checked on `GET /health` (503 while loading, without a model or when
draining), and the response names the replica that served it (`X-Ai00-Replica`). A request
that meets a replica the checks have not yet taken out (connection refused, or a 503) is
retried on the next replica of the ring, so a replica going away costs no request that had
not reached its model yet.

Replicas may serve different models: `--replica http://10.0.0.2:65530=small,org/large:7b`
says which (a replica given without `=` serves every model). A request whose JSON `model`
only some replicas serve goes to a backend of just those replicas (one backend per distinct
set of replicas), hashed, checked and retried the same way; a request without `model`, or
naming a model no list has, goes to the default backend `replicas`: the replicas given
without a list, or all of them when every replica has a list. `model` is read from the
buffered body like the affinity key: a body over tune.bufsize with `model` after its
messages goes to the default backend.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import urlsplit

# The JSON body is read into the buffer for the key: up to tune.bufsize. Longer bodies
# (long histories) hash by their first message's leading bytes, still the same every turn.
TEMPLATE = """\
# Written by `ai00-like lb-config`. HAProxy 2.6 or newer: haproxy -f {name}
global
    maxconn 4096
    tune.bufsize 262144

defaults
    mode http
    # Streamed tokens pass at once: without it HAProxy lets the kernel coalesce the small
    # SSE writes, which held the first token of every stream back by about 200 ms.
    option http-no-delay
    timeout connect 5s
    timeout client 600s
    timeout server 600s
    timeout http-request 60s

frontend ai00_like
    bind {bind}:{port}
    option http-buffer-request
    # The affinity key, first match wins.
    http-request set-var(txn.key) req.body,json_query('$.prompt_cache_key')
    http-request set-var(txn.key) req.hdr(X-Session-Id) if !{{ var(txn.key) -m found }}
    http-request set-var(txn.key) req.body,json_query('$.user') if !{{ var(txn.key) -m found }}
    http-request set-var(txn.key) req.body,json_query('$.messages[0].content') if !{{ var(txn.key) -m found }}
    http-request set-var(txn.key) req.body,json_query('$.input') if !{{ var(txn.key) -m found }}
{routes}    default_backend replicas

backend replicas
    balance hash var(txn.key)
    hash-type consistent
    # A replica that refuses the connection (stopped, killed) or answers 503 (loading,
    # shutting down) before HAProxy's checks noticed: try the next replica on the ring.
    retries 2
    option redispatch 1
    retry-on conn-failure empty-response 503
    option httpchk GET /health
    http-check expect status 200
    default-server check inter 1s fall 2 rise 1
    http-response set-header X-Ai00-Replica %s
{servers}
{backends}"""

# The frontend's lines when some model is served by only some replicas.
ROUTES_HEAD = """\
    # The requested model: one that only some replicas serve goes to a backend of those;
    # no model, or one no --replica list names: the default backend.
    http-request set-var(txn.model) req.body,json_query('$.model')
"""

# A backend of the replicas that serve some models: the same hashing and retries. A replica
# is health-checked once, in the first backend that has it; the others `track` that check.
SUBSET = """
# The replicas that serve {models}.
backend {backend}
    balance hash var(txn.key)
    hash-type consistent
    retries 2
    option redispatch 1
    retry-on conn-failure empty-response 503
{checks}    http-response set-header X-Ai00-Replica %s
{servers}
"""
CHECKS = """\
    option httpchk GET /health
    http-check expect status 200
"""

# Model names as config.toml gives them (a file's stem, served_name, aliases, a Hugging
# Face repo id): written in single quotes in the config, so none may hold a quote, a
# space or a comma (which separates them on the command line).
MODEL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/@+~-]*")
MAX_MODEL_NAME = 200
ROUTE_LINE = 800  # characters of model names on one use_backend line; HAProxy's lines are bounded


@dataclass(frozen=True)
class Replica:
    name: str  # replica1, replica2…: HAProxy's server name, and X-Ai00-Replica
    address: str  # host:port
    models: frozenset[str] | None  # None: every model


def replica_address(url: str) -> str:
    """host:port of a replica's URL (`http://10.0.0.2:65530` or `10.0.0.2:65530`)."""
    parts = urlsplit(url if "//" in url else f"//{url}")
    try:
        port = parts.port
    except ValueError:
        port = None
    if not parts.hostname or not port or parts.path not in ("", "/") or parts.query or parts.fragment:
        raise ValueError(f"'{url}' is not a replica address such as http://10.0.0.2:65530")
    if parts.scheme not in ("", "http"):
        raise ValueError(f"'{url}': replicas are reached over plain http inside the cluster")
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return f"{host}:{port}"


def model_names(spec: str, listed: str) -> frozenset[str]:
    """The models of `URL=a,b,c` (`listed` is `a,b,c`)."""
    if not listed.strip():
        raise ValueError(f"'{spec}': the list of models after '=' is empty "
                         "(give one or more, such as =small,large, or no '=' to serve every model)")
    names = []
    for name in (n.strip() for n in listed.split(",")):
        if not name:
            raise ValueError(f"'{spec}': an empty model name in the list (two commas, or one at an end)")
        if len(name) > MAX_MODEL_NAME or not MODEL_NAME.fullmatch(name):
            raise ValueError(f"'{spec}': '{name}' is not a model name: letters, digits and . _ : / @ + ~ -, "
                             f"starting with a letter or digit, at most {MAX_MODEL_NAME} characters")
        names.append(name)
    return frozenset(names)


def parse_replicas(specs: list[str]) -> list[Replica]:
    """`--replica` values: `URL` (every model) or `URL=model,model…`."""
    if not specs:
        raise ValueError("give at least one --replica")
    replicas, seen = [], {}
    for n, spec in enumerate(specs, 1):
        url, has_list, listed = spec.partition("=")
        address = replica_address(url.strip())
        if address in seen:
            raise ValueError(f"'{spec}': replica {address} is given twice (give it once, with all its models)")
        seen[address] = n
        replicas.append(Replica(f"replica{n}", address, model_names(spec, listed) if has_list else None))
    return replicas


def quoted(name: str) -> str:
    # MODEL_NAME leaves nothing that needs escaping inside single quotes, nor a leading '-'
    # that HAProxy's ACL parser would take for a flag.
    assert MODEL_NAME.fullmatch(name), name
    return f"'{name}'"


def routing(replicas: list[Replica]) -> tuple[list[Replica], dict[tuple[Replica, ...], list[str]]]:
    """The default backend's replicas, and for each other set of replicas the models only it
    serves (each model's set: the replicas that list it and those that serve everything)."""
    everything = [r for r in replicas if r.models is None]
    default = everything or replicas
    models = sorted({m for r in replicas if r.models for m in r.models})
    sets: dict[tuple[Replica, ...], list[str]] = {}
    for model in models:
        serving = tuple(r for r in replicas if r.models is None or model in r.models)
        if list(serving) != default:
            sets.setdefault(serving, []).append(model)
    return default, sets


def backend_name(serving: tuple[Replica, ...]) -> str:
    return "replicas_" + "_".join(r.name.removeprefix("replica") for r in serving)


def haproxy_config(replicas: list[str], port: int = 8080, bind: str = "0.0.0.0", name: str = "haproxy.cfg") -> str:
    """The config for `--replica` values `replicas` (`URL` or `URL=model,model…`)."""
    parsed = parse_replicas(replicas)
    default, sets = routing(parsed)
    checked = {r.name: "replicas" for r in default}  # the backend that health-checks each replica
    routes, backends = ROUTES_HEAD if sets else "", []
    for serving, models in sorted(sets.items(), key=lambda item: [parsed.index(r) for r in item[0]]):
        backend, servers, checks = backend_name(serving), [], ""
        for line in lines_of(models):
            routes += f"    use_backend {backend} if {{ var(txn.model) -m str {line} }}\n"
        for r in serving:
            if r.name in checked:
                servers.append(f"    server {r.name} {r.address} track {checked[r.name]}/{r.name}")
            else:  # in no backend before: checked here
                checked[r.name], checks = backend, CHECKS
                servers.append(f"    server {r.name} {r.address} check inter 1s fall 2 rise 1")
        backends.append(SUBSET.format(models=listing(models), backend=backend, checks=checks,
                                      servers="\n".join(servers)))
    servers = "\n".join(f"    server {r.name} {r.address}" for r in default)
    return TEMPLATE.format(bind=bind, port=port, servers=servers, name=name, routes=routes,
                           backends="".join(backends))


def lines_of(models: list[str]) -> list[str]:
    """The quoted names, a few to a line."""
    lines, line = [], []
    for model in models:
        if line and sum(len(m) + 3 for m in line) + len(model) > ROUTE_LINE:
            lines.append(" ".join(line))
            line = []
        line.append(quoted(model))
    return lines + [" ".join(line)]


def listing(models: list[str]) -> str:
    """The models of a backend, for its comment: the first few of a long list."""
    text = ", ".join(models)
    if len(text) <= 100:
        return text
    few = []
    for model in models:
        if few and len(", ".join(few + [model])) > 80:
            break
        few.append(model)
    return ", ".join(few) + f" and {len(models) - len(few)} more"

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
"""

from __future__ import annotations

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
    default_backend replicas

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
"""


def replica_address(url: str) -> str:
    """host:port of a replica's URL (`http://10.0.0.2:65530` or `10.0.0.2:65530`)."""
    parts = urlsplit(url if "//" in url else f"//{url}")
    if not parts.hostname or not parts.port or parts.path not in ("", "/"):
        raise ValueError(f"'{url}' is not a replica address such as http://10.0.0.2:65530")
    if parts.scheme not in ("", "http"):
        raise ValueError(f"'{url}': replicas are reached over plain http inside the cluster")
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return f"{host}:{parts.port}"


def haproxy_config(replicas: list[str], port: int = 8080, bind: str = "0.0.0.0", name: str = "haproxy.cfg") -> str:
    if not replicas:
        raise ValueError("give at least one --replica")
    servers = "\n".join(f"    server replica{n} {replica_address(url)}" for n, url in enumerate(replicas, 1))
    return TEMPLATE.format(bind=bind, port=port, servers=servers, name=name)

"""Conversation benchmark: time to first token of turn N of a 20-turn conversation, continued
through the Responses API's `previous_response_id` (the model reads only the new turn, from
the stored RNN state) against re-sending the whole history through chat completions with
the prefix cache off (what a server without stored states has to do), in the same run.

The server runs as `ai00-like` in a subprocess with the 0.1B-shaped seeded v7 of
bench/engine.py (saved as a bf16 .pth, as models are released) and `cache_bytes = 0`.
Each turn asks a ~40-token question and takes 16 greedy tokens; the time to first token is
measured on the stream. Prints a table and one JSON line.

    .venv/bin/python bench/conversation.py [--turns 20] [--quick]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
import engine  # noqa: E402
import record  # noqa: E402
from http_tier import Server  # noqa: E402

QUESTION = ("Turn {n}: tell me, in the words of the old books, what became of the city by the river "
            "after the flood had gone down and the people came back to their fields?")


def first_token_seconds(client: httpx.Client, path: str, body: dict,
                        done_events: tuple[str, ...] = ()) -> tuple[float, str, dict, httpx.Headers]:
    """(seconds to the first text piece, the reply's text, the final event's JSON: the one
    with usage or of a type in `done_events`, the response's headers)."""
    start, first, text, last = time.perf_counter(), None, "", {}
    with client.stream("POST", path, json={**body, "stream": True}) as resp:
        resp.raise_for_status()
        for line in resp.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            piece = event.get("delta") if event.get("type") == "response.output_text.delta" else (
                (event.get("choices") or [{}])[0].get("delta", {}).get("content"))
            if piece:
                first = first or time.perf_counter() - start
                text += piece
            if event.get("type") in done_events or event.get("usage"):
                last = event
    return first or time.perf_counter() - start, text, last, resp.headers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--quick", action="store_true", help="the 4-layer D256 model instead of the 0.1B shape")
    parser.add_argument("--no-save", action="store_true", help=record.NO_SAVE_HELP)
    args = parser.parse_args()
    path = engine.bf16_checkpoint("quick" if args.quick else "0.1B")
    server = Server(path, extra_model="cache_bytes = 0\n")
    base = server.url.rsplit("/v1/", 1)[0]
    gen = {"temperature": 0}
    rows = []
    try:
        with httpx.Client(base_url=base, timeout=600) as client:
            previous, history = None, []
            for n in range(1, args.turns + 1):
                question = QUESTION.format(n=n)
                body = {"input": question, "max_output_tokens": 16, **gen}
                if previous:
                    body["previous_response_id"] = previous
                state_s, _, done, _ = first_token_seconds(client, "/v1/responses", body, ("response.completed",))
                previous = (done.get("response") or {}).get("id", previous)
                history.append({"role": "user", "content": question})
                chat_s, reply, _, _ = first_token_seconds(
                    client, "/v1/chat/completions", {"messages": history, "max_tokens": 16, **gen})
                history.append({"role": "assistant", "content": reply})
                rows.append({"turn": n, "responses_ttft_s": state_s, "chat_full_history_ttft_s": chat_s})
                print(f"turn {n:>2}: Responses (stored state) {state_s * 1000:7.1f} ms   "
                      f"chat, whole history {chat_s * 1000:7.1f} ms", flush=True)
    finally:
        server.close()
    second, last = rows[min(1, len(rows) - 1)], rows[-1]
    summary = {"model": "quick" if args.quick else "0.1B", "turns": rows,
               "responses_last_over_turn2": last["responses_ttft_s"] / second["responses_ttft_s"],
               "chat_last_over_turn2": last["chat_full_history_ttft_s"] / second["chat_full_history_ttft_s"],
               "chat_over_responses_at_last": last["chat_full_history_ttft_s"] / last["responses_ttft_s"]}
    print(f"turn {last['turn']} / turn 2: Responses {summary['responses_last_over_turn2']:.2f}x (target <= 1.5), "
          f"chat with the whole history {summary['chat_last_over_turn2']:.2f}x; at turn {last['turn']} chat takes "
          f"{summary['chat_over_responses_at_last']:.1f}x the Responses API's time to first token")
    print(json.dumps(summary))
    record.save("conversation", summary, args)


if __name__ == "__main__":
    main()

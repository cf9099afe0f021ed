"""Reasoning models (RWKV7-G1): the prompt formats a request's effort asks for, the thinking
split from the answer (whole and streamed), the reasoning tokens counted, earlier thinking
left out of the prompt; through the real server with the openai SDK.

The tiny synthetic model never closes a thought, so over HTTP its replies are all thinking
cut by max_tokens; the demo model's own thinking is tested in test_demo_model.py.
"""

from __future__ import annotations

import random

import pytest

from ai00_like.api.oai.prompt import render_chat
from ai00_like.api.oai.reasoning import NO_THINK, THINK, ThinkPlan, ThinkReader, think_plan
from ai00_like.api.oai.types import ChatMessage
from api_helpers import SCHEMAS, InterceptedGenerates, ServerThread, config_for

HI = [{"role": "user", "content": "Who made the light?"}]


# ------------------------------------------------------------------------------ the pieces


@pytest.mark.parametrize("kind, default, effort, enable, want", [
    ("none", "medium", "high", True, ThinkPlan()),  # a model that does not think ignores the fields
    ("think", "medium", None, None, ThinkPlan(THINK)),
    ("think", "medium", "high", None, ThinkPlan(THINK)),  # no effort suffix for a pre-20250922 G1
    ("effort", "medium", None, None, ThinkPlan(THINK, " think")),
    ("effort", "medium", "low", None, ThinkPlan(THINK, " think a bit")),
    ("effort", "medium", "minimal", None, ThinkPlan(THINK, " think a bit")),
    ("effort", "low", "high", None, ThinkPlan(THINK, " think a lot")),
    ("effort", "medium", "none", None, ThinkPlan(NO_THINK)),
    ("effort", "high", None, False, ThinkPlan(NO_THINK)),  # vLLM's enable_thinking: false
    ("effort", "none", None, None, ThinkPlan(NO_THINK)),  # a model configured not to think by default
    ("effort", "none", None, True, ThinkPlan(THINK, " think")),
    ("think", "none", "low", None, ThinkPlan(THINK)),
])
def test_think_plan(kind, default, effort, enable, want):
    assert think_plan(kind, default, effort, enable) == want


def read_in_pieces(text: str, rng: random.Random) -> tuple[str, str]:
    reader, out = ThinkReader(), {"reasoning": "", "answer": ""}
    cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(0, 8))))
    for a, b in zip([0, *cuts], [*cuts, len(text)]):
        for kind, piece in reader.push(text[a:b]):
            out[kind] += piece
    for kind, piece in reader.finish():
        out[kind] += piece
    return out["reasoning"], out["answer"]


@pytest.mark.parametrize("reply, reasoning, answer", [
    ("<think>\nThe light was first.\nGod spake.\n</think>\nGod made the light.", "The light was first.\nGod spake.",
     "God made the light."),
    ("<think>\n</think>\nAnd it was so.", "", "And it was so."),  # a fake think's reply
    (" And it was so.", "", "And it was so."),  # no thinking: all answer, leading space dropped
    ("<think>\nThe heaven and the", "The heaven and the", ""),  # cut by max_tokens while thinking
    ("<think>a<b</think>c", "a<b", "c"),
    ("<thin", "", "<thin"),  # not a tag after all
])
def test_thinking_is_split_from_the_answer_however_the_text_arrives(reply, reasoning, answer):
    rng = random.Random(reply)
    assert {read_in_pieces(reply, rng) for _ in range(100)} == {(reasoning, answer)}


def test_prompt_formats():
    turns = [ChatMessage(role="user", content="Who?"),
             ChatMessage(role="assistant", content="<think>\nI ponder.\n</think>\nMoses."),
             ChatMessage(role="user", content="And then?")]
    assert render_chat(turns, opening=THINK, user_suffix=" think a lot").prompt == (
        "User: Who?\n\nAssistant: Moses.\n\nUser: And then? think a lot\n\nAssistant: <think")
    assert render_chat(turns[:1], opening=NO_THINK).prompt == "User: Who?\n\nAssistant: <think>\n</think"
    assert render_chat(turns[:1]).prompt == "User: Who?\n\nAssistant:"


# ------------------------------------------------------------------------------ over HTTP


@pytest.fixture(scope="module")
def server(model_dir):
    with ServerThread(config_for(model_dir, 'thinking = "effort"\nreasoning_effort = "low"')) as s:
        yield s


def prompt_of(server, client, **body) -> str:
    with InterceptedGenerates(server.serving) as spy:
        client.chat.completions.create(model="tiny", messages=body.pop("messages", HI), max_tokens=1, **body)
    return spy.sent[0].prompt


def test_the_request_picks_the_prompt_format(server, client):
    assert prompt_of(server, client).endswith("User: Who made the light? think a bit\n\nAssistant: <think")
    assert prompt_of(server, client, reasoning_effort="high").endswith("light? think a lot\n\nAssistant: <think")
    assert prompt_of(server, client, reasoning_effort="none").endswith("light?\n\nAssistant: <think>\n</think")
    assert prompt_of(server, client, extra_body={"chat_template_kwargs": {"enable_thinking": False}}).endswith(
        "light?\n\nAssistant: <think>\n</think")
    earlier = [*HI, {"role": "assistant", "content": "<think>\nHe.\n</think>\nGod."}, {"role": "user", "content": "Why?"}]
    assert prompt_of(server, client, messages=earlier).endswith(
        "light?\n\nAssistant: God.\n\nUser: Why? think a bit\n\nAssistant: <think")


def test_thinking_is_reasoning_content_and_counts_as_reasoning_tokens(server, client):
    body = dict(model="tiny", messages=HI, max_tokens=12, temperature=0, stop=None)
    reply = client.chat.completions.create(**body)
    SCHEMAS.check("CreateChatCompletionResponse", reply.model_dump(exclude_unset=True))
    message, usage = reply.choices[0].message, reply.usage
    assert reply.choices[0].finish_reason == "length"
    # The synthetic model never writes "</think>": all twelve tokens are thinking.
    assert message.content == "" and message.reasoning_content
    assert usage.completion_tokens == 12 and usage.completion_tokens_details.reasoning_tokens == 12

    chunks = list(client.chat.completions.create(**body, stream=True, stream_options={"include_usage": True}))
    thought = "".join(getattr(c.choices[0].delta, "reasoning_content", None) or "" for c in chunks if c.choices)
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert (thought, content) == (message.reasoning_content, "")
    assert chunks[-1].usage.completion_tokens_details.reasoning_tokens == 12


def test_thinking_off_gives_no_reasoning(server, client):
    reply = client.chat.completions.create(model="tiny", messages=HI, max_tokens=8, temperature=0,
                                           reasoning_effort="none", stop=None)
    message = reply.choices[0].message
    assert getattr(message, "reasoning_content", None) is None and message.content
    assert reply.usage.completion_tokens_details.reasoning_tokens == 0


def test_a_forced_call_replaces_the_thinking(server, client):
    tools = [{"type": "function", "function": {"name": "find_verse", "parameters": {
        "type": "object", "properties": {"book": {"type": "string", "enum": ["Ruth", "Job"]}},
        "required": ["book"]}}}]
    prompt = prompt_of(server, client, tools=tools, tool_choice="required")
    assert prompt.endswith('light?\n\nAssistant: <tool_call>{"name": "find_verse", "arguments": '), prompt

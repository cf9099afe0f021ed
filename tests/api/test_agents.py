"""Agent frameworks against the demo model: an `openai-agents` agent with a function tool (a
full tool round trip over the Responses API, the SDK's default, and over chat completions,
and a two-turn conversation through `previous_response_id`), and LangChain's `bind_tools`
with a forced tool."""

from __future__ import annotations

import asyncio

import pytest

agents = pytest.importorskip("agents")
from agents import (  # noqa: E402
    Agent,
    ModelSettings,
    OpenAIChatCompletionsModel,
    OpenAIResponsesModel,
    Runner,
    function_tool,
    set_tracing_disabled,
)
from openai import AsyncOpenAI  # noqa: E402

from ai00_like.response_store import Caller  # noqa: E402
from ai00_like.rwkv.state import State  # noqa: E402
from api_helpers import InterceptedGenerates  # noqa: E402

CALLS: list[dict] = []


@function_tool
def find_verse(book: str, chapter: int, verse: int) -> str:
    """Find a verse of the King James Bible by book, chapter and verse."""
    CALLS.append({"book": book, "chapter": chapter, "verse": verse})
    return "Whither thou goest, I will go."


def agent(demo_server, model_class) -> Agent:
    set_tracing_disabled(True)
    client = AsyncOpenAI(base_url=demo_server.base_url, api_key="unused", max_retries=0)
    return Agent(name="Scribe", instructions="Answer from the verses you find.", tools=[find_verse],
                 model=model_class(model="demo", openai_client=client),
                 model_settings=ModelSettings(tool_choice="required", temperature=0, max_tokens=64))


@pytest.mark.parametrize("model_class", [OpenAIResponsesModel, OpenAIChatCompletionsModel])
def test_an_agent_calls_its_tool_and_answers(demo_server, model_class):
    CALLS.clear()
    result = asyncio.run(Runner.run(agent(demo_server, model_class), "What does Ruth 1:16 say?", max_turns=4))
    assert len(CALLS) == 1 and set(CALLS[0]) == {"book", "chapter", "verse"}  # one call, arguments as declared
    assert isinstance(result.final_output, str) and result.final_output.strip()


def test_a_conversation_continues_through_previous_response_id(demo_server):
    scribe = agent(demo_server, OpenAIResponsesModel)

    async def two_turns():  # one event loop: the SDK's client belongs to the loop it was used in
        first = await Runner.run(scribe, "What does Ruth 1:16 say?", max_turns=4)
        second = await Runner.run(scribe, "And the next verse?", max_turns=4,
                                  previous_response_id=first.last_response_id)
        return first, second

    with InterceptedGenerates(demo_server.serving) as spy:
        first, second = asyncio.run(two_turns())
    assert first.last_response_id and first.last_response_id.startswith("resp_")
    stored = demo_server.serving.responses.get(first.last_response_id, Caller())
    assert stored is not None and stored.has_state
    assert second.final_output.strip()
    # The second turn's first request read only its own input, from the stored state.
    continued = [g for g in spy.sent if isinstance(g.state, State)]
    assert continued and "Ruth 1:16" not in continued[0].prompt and "And the next verse?" in continued[0].prompt


def test_langchain_bind_tools_with_a_forced_tool_round_trip(demo_server):
    """LangChain's `bind_tools(..., tool_choice=…)`: the forced call, its result as a
    ToolMessage, then the model's answer."""
    from langchain_core.messages import HumanMessage, ToolMessage
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    @tool
    def count_word(word: str) -> int:
        """How many times a word occurs in the King James Bible."""
        return 42

    llm = ChatOpenAI(model="demo", base_url=demo_server.base_url, api_key="unused", temperature=0, max_tokens=64,
                     max_retries=0)
    question = HumanMessage("How often does the word light occur?")
    called = llm.bind_tools([count_word], tool_choice="count_word").invoke([question])
    [call] = called.tool_calls
    assert call["name"] == "count_word" and isinstance(call["args"].get("word"), str)
    answer = llm.bind_tools([count_word]).invoke(
        [question, called, ToolMessage(str(count_word.invoke(call["args"])), tool_call_id=call["id"])])
    assert isinstance(answer.content, str) and (answer.content.strip() or answer.tool_calls)

"""LlamaIndex: a tool-calling agent on LlamaIndex's OpenAI LLM, recorded.

The agent answers a weather question in the loop LlamaIndex's function-calling LLMs
are driven by: ``chat_with_tools`` offers the tools (``FunctionTool`` objects around
functions recorded through ``agent_blackbox.tool``), the tool calls the model asks for
are run, their results go back as ``tool`` messages, until the model answers in text.
:func:`answer_with_agent` is the same agent as LlamaIndex's ``FunctionAgent``.

The wiring is one argument: the LLM is given a recording OpenAI client
(``openai_client=agent_blackbox.capture_openai(openai.OpenAI())``), which works on every
``openai`` release the LLM accepts. One LLM per process serves every run: each call
records into the run in force where it is made.
"""

from __future__ import annotations

import functools

import openai
from llama_index.core.agent.workflow import FunctionAgent
from llama_index.core.llms import ChatMessage, ChatResponse
from llama_index.core.tools import FunctionTool, ToolSelection
from llama_index.llms.openai import OpenAI

import agent_blackbox as bb

MODEL = "gpt-4o-mini"
SYSTEM_PROMPT = "You answer questions about the weather. Look it up with get_weather first."
MAX_TOOL_ROUNDS = 4


@bb.tool
def get_weather(city: str) -> str:
    """The current weather in a city (a stand-in for a weather API)."""
    return f"{city}: {5 + sum(map(ord, city)) % 20} degrees celsius, clear sky"


TOOLS = [FunctionTool.from_defaults(fn=get_weather)]


@functools.cache
def llm() -> OpenAI:
    """The process's LLM (``OPENAI_API_KEY``, ``OPENAI_BASE_URL``), recording."""
    return OpenAI(
        model=MODEL,
        openai_client=bb.capture_openai(openai.OpenAI()),
        async_openai_client=bb.capture_openai(openai.AsyncOpenAI()),
    )


def _started(question: str) -> list[ChatMessage]:
    return [
        ChatMessage(role="system", content=SYSTEM_PROMPT),
        ChatMessage(role="user", content=question),
    ]


def _tool_messages(calls: list[ToolSelection]) -> list[ChatMessage]:
    """Run the tools the model asked for; their results as ``tool`` messages."""
    by_name = {tool.metadata.name: tool for tool in TOOLS}
    return [
        ChatMessage(
            role="tool",
            content=str(by_name[call.tool_name].call(**call.tool_kwargs)),
            additional_kwargs={"tool_call_id": call.tool_id, "name": call.tool_name},
        )
        for call in calls
    ]


def _tool_calls(response: ChatResponse) -> list[ToolSelection]:
    calls: list[ToolSelection] = llm().get_tool_calls_from_response(
        response, error_on_no_tool_call=False
    )
    return calls


def answer(run: object, question: str) -> str:
    """The entry point: ask, run the tools asked for, until the model answers."""
    messages = _started(question)
    for _ in range(MAX_TOOL_ROUNDS):
        response = llm().chat_with_tools(TOOLS, chat_history=list(messages))
        calls = _tool_calls(response)
        if not calls:
            return str(response.message.content)
        messages += [response.message, *_tool_messages(calls)]
    raise RuntimeError(f"no answer after {MAX_TOOL_ROUNDS} rounds of tool calls")


async def answer_with_agent(run: object, question: str) -> str:
    """The same agent as LlamaIndex's ``FunctionAgent`` (a workflow, asyncio, streaming
    the model's answers): the same tools, the same LLM."""
    agent = FunctionAgent(tools=TOOLS, llm=llm(), system_prompt=SYSTEM_PROMPT)
    response = await agent.run(user_msg=question)
    return str(response)

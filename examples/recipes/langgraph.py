"""A LangGraph agent recorded by agent-blackbox, on OpenAI or Anthropic chat models.

The agent is the usual tool loop as a small graph: a model node asks the chat model
(LangChain's ``ChatOpenAI`` or ``ChatAnthropic``, with the tools bound), LangGraph's
``ToolNode`` runs the tools it asked for, and the loop ends when the model answers in text.

How it is recorded:

- **Model calls**: both chat models build their own SDK clients. Call
  ``agent_blackbox.instrument()`` once at startup and every call either model makes, sync
  or async, plain or streamed, is an ``llm.call`` of the run in force. ``ChatOpenAI`` also
  takes recording clients instead (:func:`recorded_chat_openai`); ``ChatAnthropic`` takes
  no HTTP client, so it needs ``instrument()``. Without either, its calls are holes:
  reported on the run, refused in replay.
- **Tools**: ``@tool`` over ``@bb.tool``, in that order. ``bb.tool`` keeps the function's
  name, signature and docstring, from which LangChain builds the tool's schema; the other
  way round, ``bb.tool`` would get LangChain's tool object, not a function, and refuse it.
- **LangSmith**: leave ``LANGSMITH_TRACING`` (and ``LANGCHAIN_TRACING_V2``) unset or
  ``false`` where runs are recorded and replayed. LangChain's tracer sends each run's
  prompts and answers to LangSmith from a thread of its own, which the recorder neither
  records nor sees; in replay it would go online.

The entry points (:meth:`WeatherAgent.answer` and its async twins) are called as
``entry(run, question)`` by the recorder and by the replayer alike; they do not use the
run they are given, since the model and tool calls find the run in force themselves.
"""

from __future__ import annotations

from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessageChunk, AnyMessage, HumanMessage, SystemMessage
from langchain_core.runnables import RunnableLambda
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition

import agent_blackbox as bb

__all__ = ["SYSTEM_PROMPT", "TOOLS", "WeatherAgent", "get_weather", "recorded_chat_openai"]

SYSTEM_PROMPT = "You answer questions about the weather. Look it up with the tools; never guess."

_REPORTS = {"Oslo": "light snow, -3 C", "Lisbon": "sunny, 19 C", "Paris": "overcast, 11 C"}


@tool
@bb.tool
def get_weather(city: str) -> str:
    """The weather in a city right now."""
    return f"{city}: {_REPORTS.get(city, 'clear, 15 C')}"


TOOLS = [get_weather]


def recorded_chat_openai(**options: Any) -> ChatOpenAI:
    """A ``ChatOpenAI`` whose calls are recorded without ``instrument()``: its sync and
    async SDK clients send through recording HTTP clients (``options`` are
    ``ChatOpenAI``'s own: model, base_url, api_key...)."""
    return ChatOpenAI(
        http_client=bb.http_client(), http_async_client=bb.async_http_client(), **options
    )


class WeatherAgent:
    """Answers a weather question with a tool loop on ``model``.

    One agent (and one chat model) serves any number of runs at once: each call records
    into the run in force where it is made.

    Args:
        model: the chat model (``ChatOpenAI``, ``ChatAnthropic``, ...).
        prompt: the system prompt.
    """

    def __init__(self, model: BaseChatModel, *, prompt: str = SYSTEM_PROMPT) -> None:
        self.prompt = prompt
        self._model = model.bind_tools(TOOLS)
        graph = StateGraph(MessagesState)
        graph.add_node("model", RunnableLambda(self._think, afunc=self._think_async))
        graph.add_node("tools", ToolNode(TOOLS))
        graph.add_edge(START, "model")
        graph.add_conditional_edges("model", tools_condition)
        graph.add_edge("tools", "model")
        self.graph = graph.compile()

    def _conversation(self, state: MessagesState) -> list[AnyMessage]:
        return [SystemMessage(self.prompt), *state["messages"]]

    def _think(self, state: MessagesState) -> dict[str, list[Any]]:
        reply = self._model.invoke(self._conversation(state))
        return {"messages": [reply]}

    async def _think_async(self, state: MessagesState) -> dict[str, list[Any]]:
        reply = await self._model.ainvoke(self._conversation(state))
        return {"messages": [reply]}

    def answer(self, run: object, question: str) -> str:
        """The model's final answer to ``question`` (runs the graph with ``invoke``)."""
        final = self.graph.invoke(MessagesState(messages=[HumanMessage(question)]))
        return str(final["messages"][-1].text)

    async def answer_async(self, run: object, question: str) -> str:
        """:meth:`answer` with ``ainvoke``."""
        final = await self.graph.ainvoke(MessagesState(messages=[HumanMessage(question)]))
        return str(final["messages"][-1].text)

    async def answer_streamed(self, run: object, question: str) -> list[str]:
        """The model's text, token by token as it streamed (every turn's: a model may
        say something before it calls a tool). ``astream`` with ``stream_mode="messages"``
        makes the chat model stream its calls; ``version="v2"`` gives typed parts."""
        tokens: list[str] = []
        start = MessagesState(messages=[HumanMessage(question)])
        async for part in self.graph.astream(start, stream_mode="messages", version="v2"):
            if part["type"] != "messages":
                continue
            message, metadata = part["data"]
            if metadata.get("langgraph_node") == "model" and isinstance(message, AIMessageChunk):
                token = str(message.text)
                if token:
                    tokens.append(token)
        return tokens

"""Drives `headcount serve` on tests/fixtures/glm-bytes (a random model with a byte-level
tokenizer, served with --tool-call-parser glm45 and --reasoning-parser glm45) with the agent
APIs' official clients: the `anthropic` SDK on the Messages API (a message, a forced tool_use
whose input follows its schema, a streamed message through the SDK's stream helper, a tool
result sent back, count_tokens, refusals), the `openai` SDK's Responses API (whole and
streamed, a forced function call, `text.format` json_schema through `responses.parse`, a
two-turn conversation by `previous_response_id`, retrieval and `store: false`) and the
`openai-agents` SDK with its default model (Responses API): an agent that must call a function
tool. Run by runtime/cli/tests/serve.rs.

    .venv/bin/python python/agents_test.py --url http://127.0.0.1:PORT --model NAME
"""

import argparse
import asyncio
import json
from typing import Annotated

import anthropic
import openai
from pydantic import BaseModel, Field


class Gauge(BaseModel):
    # Bounded, so that random weights finish the call within max_tokens.
    station: str = Field(max_length=8)
    hours: int = Field(ge=1, le=48)


GAUGE_SCHEMA = {
    "type": "object",
    "properties": {"station": {"type": "string", "maxLength": 8},
                   "hours": {"type": "integer", "minimum": 1, "maximum": 48}},
    "required": ["station", "hours"],
}


def check_gauge(args: dict) -> None:
    """Arguments a forced call writes follow the tool's schema, whatever the weights."""
    g = Gauge.model_validate(args)
    assert set(args) == {"station", "hours"}, args
    print("gauge:", g.model_dump_json())


def messages_api(url: str, model: str) -> None:
    client = anthropic.Anthropic(base_url=url, api_key="none", max_retries=0)
    msgs = [{"role": "user", "content": "The river level, please."}]
    m = client.messages.create(model=model, max_tokens=24, messages=msgs)
    assert m.type == "message" and m.role == "assistant", m
    assert m.stop_reason in ("end_turn", "max_tokens"), m
    assert m.usage.input_tokens > 0 and 0 < m.usage.output_tokens <= 24, m.usage
    counted = client.messages.count_tokens(model=model, messages=msgs)
    assert counted.input_tokens == m.usage.input_tokens, (counted, m.usage)

    # A forced tool: its input parses and follows the schema, and the turn ends for the tool.
    tools = [{"name": "gauge", "description": "The river level at a gauging station.", "input_schema": GAUGE_SCHEMA}]
    m = client.messages.create(model=model, max_tokens=160, messages=msgs, tools=tools,
                               tool_choice={"type": "tool", "name": "gauge"})
    assert m.stop_reason == "tool_use", m
    uses = [b for b in m.content if b.type == "tool_use"]
    assert len(uses) == 1 and uses[0].name == "gauge", m.content
    check_gauge(uses[0].input)

    # The tool's result goes back; the model answers the next turn.
    follow = msgs + [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in m.content]},
                     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": uses[0].id,
                                                   "content": "3.2 m"}]}]
    m2 = client.messages.create(model=model, max_tokens=8, messages=follow, tools=tools)
    assert m2.usage.input_tokens > m.usage.input_tokens, (m2.usage, m.usage)

    # Streamed through the SDK's helper: the text events join to the final message's text.
    with client.messages.stream(model=model, max_tokens=24, messages=msgs) as stream:
        streamed = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert final.stop_reason in ("end_turn", "max_tokens"), final
    assert streamed == "".join(b.text for b in final.content if b.type == "text"), (streamed, final.content)
    # A forced call streamed: the input the helper assembles from its deltas follows the schema.
    with client.messages.stream(model=model, max_tokens=160, messages=msgs, tools=tools,
                                tool_choice={"type": "any"}) as stream:
        final = stream.get_final_message()
    assert final.stop_reason == "tool_use", final
    check_gauge([b for b in final.content if b.type == "tool_use"][0].input)

    # What the server cannot do is a 400 in Anthropic's shape, naming the field.
    try:
        client.messages.create(model=model, max_tokens=8, messages=[{"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_none", "content": "x"}]}])
        raise AssertionError("a tool_result answering no tool_use was accepted")
    except anthropic.BadRequestError as e:
        assert e.body["type"] == "error" and "tool_use_id" in e.body["error"]["message"], e.body
    print("messages api: ok")


def responses_api(url: str, model: str) -> None:
    client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
    r = client.responses.create(model=model, input="The river level, please.", max_output_tokens=24,
                                temperature=1.0)
    assert r.status in ("completed", "incomplete"), r
    assert isinstance(r.output_text, str) and r.usage.output_tokens > 0, r

    # Streamed: the deltas join to the completed response's text, numbered in order.
    events = list(client.responses.create(model=model, input="The river level, please.", max_output_tokens=24,
                                          temperature=1.0, stream=True))
    numbers = [e.sequence_number for e in events]
    assert numbers == list(range(len(events))), numbers
    assert events[0].type == "response.created", events[0]
    last = events[-1]
    assert last.type in ("response.completed", "response.incomplete"), last
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == last.response.output_text, (deltas, last.response.output_text)

    # A forced function call whose arguments follow the schema, through the stream helper.
    tools = [{"type": "function", "name": "gauge", "description": "The river level at a gauging station.",
              "parameters": GAUGE_SCHEMA}]
    with client.responses.stream(model=model, input="The river level, please.", tools=tools,
                                 tool_choice="required", max_output_tokens=160, temperature=1.0) as stream:
        for _ in stream:
            pass
        final = stream.get_final_response()
    calls = [o for o in final.output if o.type == "function_call"]
    assert final.status == "completed" and len(calls) == 1 and calls[0].name == "gauge", final
    check_gauge(json.loads(calls[0].arguments))

    # text.format json_schema: the answer parses into the model.
    parsed = client.responses.parse(model=model, input="The river level, please.", text_format=Gauge,
                                     max_output_tokens=160, temperature=1.0)
    assert isinstance(parsed.output_parsed, Gauge), parsed
    print("parsed:", parsed.output_parsed.model_dump_json())

    # Two turns by previous_response_id: the second prompt holds the first turn.
    first = client.responses.create(model=model, input="12+34", max_output_tokens=8)
    second = client.responses.create(model=model, input="and 5+6?", previous_response_id=first.id,
                                     max_output_tokens=8)
    assert second.previous_response_id == first.id
    assert second.usage.input_tokens > first.usage.input_tokens, (second.usage, first.usage)
    assert client.responses.retrieve(first.id).output_text == first.output_text
    unstored = client.responses.create(model=model, input="12+34", max_output_tokens=4, store=False)
    try:
        client.responses.retrieve(unstored.id)
        raise AssertionError("a response made with store false was kept")
    except openai.NotFoundError:
        pass
    try:
        client.responses.create(model=model, input="x", tools=[{"type": "web_search"}])
        raise AssertionError("a web_search tool was accepted")
    except openai.BadRequestError as e:
        assert e.body["param"] == "tools[0].type", e.body
    print("responses api: ok")


def agent(url: str, model: str) -> None:
    """An openai-agents Agent with its default model (the Responses API) that must call its
    function tool: the tool runs with arguments its schema accepts, and its output ends the
    run."""
    from agents import Agent, ModelSettings, Runner, function_tool, set_default_openai_client, set_tracing_disabled

    set_tracing_disabled(True)
    set_default_openai_client(openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0))
    ran = []

    @function_tool
    def gauge(station: Annotated[str, Field(max_length=8)], hours: Annotated[int, Field(ge=1, le=48)]) -> str:
        """The river level at a gauging station over the last hours.

        Args:
            station: The station's code.
            hours: How many hours back.
        """
        ran.append({"station": station, "hours": hours})
        return "3.2 m"

    # The tool's output is the agent's answer: a random model would not end a free turn.
    a = Agent(name="hydrologist", instructions="Answer with the gauge.", model=model, tools=[gauge],
              tool_use_behavior="stop_on_first_tool",
              model_settings=ModelSettings(tool_choice="required", max_tokens=160, temperature=1.0))
    result = asyncio.run(Runner.run(a, "The river level, please.", max_turns=3))
    assert len(ran) == 1, ran
    Gauge.model_validate(ran[0])
    assert result.final_output == "3.2 m", result
    print("agent: ran", ran)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--model", required=True)
    a = ap.parse_args()
    messages_api(a.url, a.model)
    responses_api(a.url, a.model)
    agent(a.url, a.model)


if __name__ == "__main__":
    main()

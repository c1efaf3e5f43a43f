"""Drives `headcount serve` on tests/fixtures/glm-bytes (a random model with a byte-level
tokenizer, served with --tool-call-parser glm45) with the official openai client's structured
output (`chat.completions.parse` with a Pydantic model, a `json_object` answer, a schema the
server refuses) and with langchain-openai's tool calling (`ChatOpenAI.bind_tools` with
tool_choice "required" and a named tool, and streamed). Run by runtime/cli/tests/serve.rs.

    .venv/bin/python python/structured_test.py --url http://127.0.0.1:PORT --model NAME
"""

import argparse
import json
from typing import Literal

import openai
from pydantic import BaseModel, Field


class Reading(BaseModel):
    station: str = Field(max_length=6)
    level: int = Field(ge=0, le=99)
    unit: Literal["cm", "m"]
    ok: bool


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--model", required=True)
    a = ap.parse_args()
    client = openai.OpenAI(base_url=a.url + "/v1", api_key="none", max_retries=0)
    messages = [{"role": "user", "content": "The river level, please."}]
    # Whatever the random weights say, the answer parses into the Pydantic model.
    for seed in range(3):
        done = client.chat.completions.parse(model=a.model, messages=messages, response_format=Reading,
                                             max_tokens=120, temperature=1.0, seed=seed)
        choice = done.choices[0]
        assert choice.finish_reason == "stop", choice
        parsed = choice.message.parsed
        assert isinstance(parsed, Reading), choice.message
        print("parsed:", parsed.model_dump_json())
    # json_object: any JSON object.
    r = client.chat.completions.create(model=a.model, messages=messages, response_format={"type": "json_object"},
                                       max_tokens=120, temperature=1.0, seed=7)
    text = r.choices[0].message.content
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(text), dict), text
    # A schema the grammar engine refuses: a 400 naming response_format.
    try:
        client.chat.completions.create(model=a.model, messages=messages, max_tokens=4, response_format={
            "type": "json_schema", "json_schema": {"name": "bad", "schema": {"type": "no-such-type"}}})
        raise AssertionError("a bad schema was accepted")
    except openai.BadRequestError as e:
        assert "response_format" in str(e), e
    print("structured output: ok")
    tools_through_langchain(a.url, a.model)


def tools_through_langchain(url: str, model: str) -> None:
    """Tool calls forced by tool_choice, whatever the weights: each comes back as a call of
    a bound tool with arguments its schema accepts."""
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    class GaugeArgs(BaseModel):
        # Bounded, so that random weights finish the call within max_tokens.
        station: str = Field(max_length=8)
        hours: int = Field(ge=1, le=48)

    @tool(args_schema=GaugeArgs)
    def gauge(station: str, hours: int) -> str:
        """The river level at a gauging station over the last hours."""
        return f"{station}: {hours}"

    @tool
    def clock() -> str:
        """The time now."""
        return "now"

    llm = ChatOpenAI(base_url=url + "/v1", api_key="none", model=model, max_tokens=160, temperature=1.0,
                     max_retries=0)
    for seed, choice in enumerate(["required", "gauge", "clock"]):
        bound = llm.bind_tools([gauge, clock], tool_choice=choice).bind(seed=seed)
        msg = bound.invoke("The river level, please.")
        assert len(msg.tool_calls) == 1, msg
        call = msg.tool_calls[0]
        assert call["name"] in ("gauge", "clock") and (choice == "required" or call["name"] == choice), call
        if call["name"] == "gauge":
            # The schema types the arguments: hours is an integer, station a string.
            assert isinstance(call["args"].get("station"), str) and isinstance(call["args"].get("hours"), int), call
        print("tool call:", call["name"], call["args"])
    # Streamed: the chunks add up to one call of the named tool.
    chunks = None
    for c in llm.bind_tools([gauge, clock], tool_choice="gauge").bind(seed=9).stream("Level?"):
        chunks = c if chunks is None else chunks + c
    assert chunks is not None and [t["name"] for t in chunks.tool_calls] == ["gauge"], chunks
    assert isinstance(chunks.tool_calls[0]["args"].get("hours"), int), chunks.tool_calls
    print("langchain tool calls: ok")


if __name__ == "__main__":
    main()

"""Drives `headcount serve` on tests/fixtures/glm-bytes (a random model with a byte-level
tokenizer) with the official openai client's structured output: `chat.completions.parse`
with a Pydantic model, a `json_object` answer, and a schema the server refuses. Run by
runtime/cli/tests/serve.rs.

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


if __name__ == "__main__":
    main()

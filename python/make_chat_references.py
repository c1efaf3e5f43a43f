"""Chat-template references: conversations rendered by transformers' apply_chat_template
machinery (render_jinja_template), which headcount's renderer must reproduce exactly.

Writes tests/fixtures/chat-templates/references.json from:
- the addition demo's template (also written to examples/addition/model/tokenizer_config.json);
- tests/fixtures/chat-templates/glm4-format.jinja, a template of GLM-4's chat format (the
  [gMASK]<sop> prefix and <|system|>/<|user|>/<|assistant|>/<|observation|> turns) that uses
  what GLM-4's published templates use: tools through tojson(indent=4), dict .get, str.strip,
  loop filters, `is defined`, raise_exception, and trim/lstrip whitespace control.

  python/make_chat_references.py [--template NAME=PATH ...]

--template adds another template (for instance a checkpoint's chat_template.jinja) to check
locally; the committed references hold only the two above.
"""

import argparse
import json
import sys
from pathlib import Path

from transformers.utils.chat_template_utils import render_jinja_template

sys.path.insert(0, str(Path(__file__).parent))
from demo_common import MODEL_DIR, tokenizer_config  # noqa: E402

OUT = Path("tests/fixtures/chat-templates")

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather of a city, in °C",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "description": "e.g. \"Zürich\""}, "days": {"type": "integer"}},
                "required": ["city"],
            },
        },
    }
]

GLM4_CONVERSATIONS = [
    ([{"role": "user", "content": "Hello!"}], None, True),
    ([{"role": "system", "content": "You are a careful assistant."}, {"role": "user", "content": "What is 2+2?"}], None, True),
    (
        [
            {"role": "system", "content": "Answer briefly."},
            {"role": "user", "content": "Name a prime."},
            {"role": "assistant", "content": "  7  "},
            {"role": "user", "content": "Another one, 你好?"},
        ],
        None,
        True,
    ),
    ([{"role": "user", "content": "Weather in Zürich?"}], TOOLS, True),
    (
        [
            {"role": "user", "content": "Weather in Bern?"},
            {"role": "assistant", "content": "{\"city\": \"Bern\"}", "metadata": "get_weather"},
            {"role": "tool", "content": "{\"temp\": 4}"},
        ],
        TOOLS,
        True,
    ),
    ([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}], None, False),
    ([{"role": "narrator", "content": "x"}], None, True),
]

DEMO_CONVERSATIONS = [
    ([{"role": "user", "content": "12+34"}], None, True),
    ([{"role": "user", "content": " 907+95 "}], None, True),
    ([{"role": "system", "content": "sums"}, {"role": "user", "content": "1+1"}, {"role": "assistant", "content": "2"}, {"role": "user", "content": "5+5"}], None, True),
    ([{"role": "user", "content": "3+4"}], None, False),
    ([{"role": "tool", "content": "3"}], None, True),
]


def render(template: str, messages, tools, gen: bool, specials: dict) -> dict:
    case = {"messages": messages, "tools": tools, "add_generation_prompt": gen}
    try:
        out = render_jinja_template(
            conversations=[messages], tools=tools, chat_template=template, add_generation_prompt=gen, **specials
        )
        rendered = out[0] if isinstance(out, tuple) else out
        case["rendered"] = rendered[0] if isinstance(rendered, list) else rendered
    except Exception as e:  # the template's raise_exception
        case["error"] = str(e)
    return case


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--template", action="append", default=[], help="NAME=PATH of another template")
    args = ap.parse_args()
    cfg = tokenizer_config()
    (MODEL_DIR / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    specials = {k: cfg[k] for k in ("bos_token", "eos_token", "pad_token", "unk_token")}
    templates = {
        "addition-demo": (cfg["chat_template"], specials, DEMO_CONVERSATIONS),
        "glm4-format": ((OUT / "glm4-format.jinja").read_text(), {}, GLM4_CONVERSATIONS),
    }
    extra = {}
    for t in args.template:
        name, path = t.split("=", 1)
        extra[name] = (Path(path).read_text(), {}, GLM4_CONVERSATIONS)
    cases = []
    for name, (source, sp, convs) in {**templates, **extra}.items():
        for messages, tools, gen in convs:
            case = render(source, messages, tools, gen, sp)
            case["template"] = name
            case["specials"] = sp
            cases.append(case)
    out = OUT / ("references.json" if not extra else "references-local.json")
    if extra:
        for name, (source, _, _) in extra.items():
            (OUT / f"{name}.local.jinja").write_text(source)
    out.write_text(json.dumps(cases, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {len(cases)} cases to {out}")


if __name__ == "__main__":
    main()

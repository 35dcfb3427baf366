"""Structured outputs and forced tool calls through the official `openai` client, against a
colocated pdserve-decode or a 1P1D cluster behind pdserve-proxy (argument: colocated | 1p1d),
streamed and not. The model has random weights: only the grammar can make its outputs valid,
so every output is checked (jsonschema, re.fullmatch, the choices) on many seeds. Through the
cluster the prefill node samples the first token under the same grammar (a first token the
grammar refuses would fail the request on the decode node).
"""
import json
import os
import re
import sys
from types import SimpleNamespace

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "python"))
import jsonschema  # noqa: E402
import openai  # noqa: E402
import pdserve_testing as t  # noqa: E402

t.set_deadline(200)
TARGET = sys.argv[1] if len(sys.argv) > 1 else "colocated"
SEEDS = range(6)
NO_THINKING = {"chat_template_kwargs": {"enable_thinking": False}}

# Bounded: every string, number and array has a limit, so every output finishes.
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "pets": {"type": "array", "items": {"enum": ["cat", "dog", "fish"]}, "maxItems": 3},
        "member": {"type": "boolean"},
        "nickname": {"anyOf": [{"type": "string", "maxLength": 4}, {"type": "null"}]},
    },
    "required": ["name", "age", "pets", "member", "nickname"],
    "additionalProperties": False,
}
TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "maxLength": 10},
            "unit": {"enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"], "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "add", "parameters": {"type": "object", "properties": {
            "a": {"type": "integer", "minimum": -99, "maximum": 99},
            "b": {"type": "integer", "minimum": -99, "maximum": 99}},
            "required": ["a", "b"], "additionalProperties": False}}},
]
TOOL_SCHEMAS = {tool["function"]["name"]: tool["function"]["parameters"] for tool in TOOLS}
TOOL_CALL = re.compile(r"<tool_call>\n(.*?)\n</tool_call>", re.S)

model_dir = t.make_model()
target = t.start_target(TARGET, model_dir)
client = openai.OpenAI(base_url=target.url + "/v1", api_key="x", max_retries=0, timeout=60)
model = target.name
messages = [{"role": "user", "content": "Describe a person as JSON."}]


def chat(stream=False, **kwargs):
    extra = dict(NO_THINKING, **kwargs.pop("extra_body", {}))
    kwargs.setdefault("temperature", 1.0)
    kwargs.setdefault("max_tokens", 200)
    response = client.chat.completions.create(model=model, messages=kwargs.pop("messages", messages),
                                              extra_body=extra, stream=stream, **kwargs)
    if not stream:
        return [(choice.message.content or "", choice.finish_reason, choice.message) for choice in response.choices]
    texts, reasons, calls = {}, {}, {}
    for chunk in response:
        for choice in chunk.choices:
            texts[choice.index] = texts.get(choice.index, "") + (choice.delta.content or "")
            for call in choice.delta.tool_calls or []:
                entry = calls.setdefault(choice.index, {}).setdefault(call.index, ["", ""])
                entry[0] += call.function.name or ""
                entry[1] += call.function.arguments or ""
            if choice.finish_reason:
                reasons[choice.index] = choice.finish_reason

    def message(i):
        """The streamed tool calls, shaped as a message's."""
        if i not in calls:
            return None
        return SimpleNamespace(tool_calls=[
            SimpleNamespace(function=SimpleNamespace(name=name, arguments=arguments))
            for _, (name, arguments) in sorted(calls[i].items())])
    return [(texts.get(i, ""), reasons.get(i), message(i)) for i in sorted(set(texts) | set(reasons))]


def complete(stream=False, **kwargs):
    kwargs.setdefault("temperature", 1.0)
    kwargs.setdefault("max_tokens", 200)
    response = client.completions.create(model=model, prompt=kwargs.pop("prompt", "A person:"), stream=stream,
                                         **kwargs)
    if not stream:
        return [(choice.text, choice.finish_reason) for choice in response.choices]
    texts, reasons = {}, {}
    for chunk in response:
        for choice in chunk.choices:
            texts[choice.index] = texts.get(choice.index, "") + choice.text
            if choice.finish_reason:
                reasons[choice.index] = choice.finish_reason
    return [(texts[i], reasons.get(i)) for i in sorted(texts)]


def expect_valid_json(text, reason, schema):
    t.expect_equal(reason, "stop", f"finish_reason of {text!r}")
    value = json.loads(text)
    jsonschema.validate(value, schema)
    t.expect("\n" not in text and "  " not in text.replace('"  ', ""), f"compact JSON: {text!r}")
    return value


def json_schema_chat():
    response_format = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
    outputs = 0
    for seed in SEEDS:
        for stream in (False, True):
            for text, reason, _ in chat(stream=stream, seed=seed, n=2, response_format=response_format):
                expect_valid_json(text, reason, PERSON)
                outputs += 1
    t.expect_equal(outputs, len(SEEDS) * 4, "outputs checked")


def json_schema_completions():
    for seed in SEEDS:
        for stream in (False, True):
            for text, reason in complete(stream=stream, seed=seed, extra_body={"guided_json": PERSON}):
                expect_valid_json(text, reason, PERSON)
            for text, reason in complete(stream=stream, seed=seed,
                                         extra_body={"structured_outputs": {"json": json.dumps(PERSON)}}):
                expect_valid_json(text, reason, PERSON)


def json_object():
    # Keys and strings are unbounded: an output cut by max_tokens is an unfinished object.
    finished = 0
    for seed in SEEDS:
        for text, reason, _ in chat(seed=seed, max_tokens=40, response_format={"type": "json_object"}):
            t.expect(text.startswith("{"), f"an object: {text!r}")
            if reason == "stop":
                t.expect(isinstance(json.loads(text), dict), f"an object: {text!r}")
                finished += 1
            else:
                t.expect_equal(reason, "length", "finish_reason")
    print(f"     json_object: {finished} of {len(SEEDS)} finished within 40 tokens")


def guided_choice():
    choices = ["yes", "no", "maybe later", "¿quién sabe?"]
    seen = set()
    for seed in SEEDS:
        for stream in (False, True):
            for text, reason in complete(stream=stream, seed=seed, n=3, extra_body={"guided_choice": choices}):
                t.expect(text in choices, f"{text!r} is one of the choices")
                t.expect_equal(reason, "stop", "finish_reason")
                seen.add(text)
            for text, reason, _ in chat(stream=stream, seed=seed, extra_body={"guided_choice": choices}):
                t.expect(text in choices, f"{text!r} is one of the choices")
    t.expect(len(seen) > 1, f"the draws vary: {seen}")


def guided_regex():
    pattern = r"(\+\d{1,3} )?\(\d{3}\) \d{3}-\d{4}|[A-Z][a-z]{2,8}@example\.(com|org)"
    for seed in SEEDS:
        for stream in (False, True):
            for text, reason in complete(stream=stream, seed=seed, n=2, extra_body={"guided_regex": pattern}):
                t.expect(re.fullmatch(pattern, text) is not None, f"{text!r} fullmatches the regex")
                t.expect_equal(reason, "stop", "finish_reason")
            for text, reason, _ in chat(stream=stream, seed=seed,
                                        extra_body={"structured_outputs": {"regex": pattern}}):
                t.expect(re.fullmatch(pattern, text) is not None, f"{text!r} fullmatches the regex")


def tool_calls_of(text, message):
    """(name, arguments) of each call: message.tool_calls when the server parsed them, else the
    hermes blocks of the text (the whole text, nothing around them)."""
    if message is not None and getattr(message, "tool_calls", None):
        return [(call.function.name, json.loads(call.function.arguments)) for call in message.tool_calls]
    blocks = TOOL_CALL.findall(text)
    rebuilt = "\n".join(f"<tool_call>\n{block}\n</tool_call>" for block in blocks)
    t.expect_equal(rebuilt, text, "the output is tool calls only")
    calls = []
    for block in blocks:
        value = json.loads(block)
        t.expect_equal(list(value), ["name", "arguments"], "the keys of a tool call")
        calls.append((value["name"], value["arguments"]))
    return calls


def tool_choice_required():
    for seed in SEEDS:
        for stream in (False, True):
            for text, reason, message in chat(stream=stream, seed=seed, max_tokens=400, tools=TOOLS,
                                              tool_choice="required",
                                              messages=[{"role": "user", "content": "Weather in Paris?"}]):
                t.expect(reason in ("stop", "tool_calls", "length"), f"finish_reason {reason} of {text!r}")
                if reason == "length" and not (message and message.tool_calls):
                    # Several calls, cut by max_tokens: the calls before the cut are complete.
                    text = text[:text.rfind("</tool_call>") + len("</tool_call>")]
                elif reason == "length" and stream:
                    # A stream announces a call before its arguments are complete: one cut by
                    # max_tokens stays with the arguments it had; the ones before it are whole.
                    *whole, last = message.tool_calls
                    try:
                        json.loads(last.function.arguments)
                    except json.JSONDecodeError:
                        message.tool_calls = whole
                calls = tool_calls_of(text, message)
                t.expect(len(calls) >= 1, f"at least one call: {text!r}")
                for name, arguments in calls:
                    t.expect(name in TOOL_SCHEMAS, f"a known tool: {name}")
                    jsonschema.validate(arguments, TOOL_SCHEMAS[name])


def tool_choice_named():
    for seed in SEEDS:
        for stream in (False, True):
            choice = {"type": "function", "function": {"name": "add"}}
            for text, reason, message in chat(stream=stream, seed=seed, tools=TOOLS, tool_choice=choice,
                                              messages=[{"role": "user", "content": "2 + 3?"}]):
                t.expect(reason in ("stop", "tool_calls"), f"finish_reason {reason} of {text!r}")
                calls = tool_calls_of(text, message)
                t.expect_equal(len(calls), 1, "one call")
                t.expect_equal(calls[0][0], "add", "the named function")
                jsonschema.validate(calls[0][1], TOOL_SCHEMAS["add"])


def max_tokens_cut():
    [(text, reason, _)] = chat(seed=1, max_tokens=3, response_format={
        "type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}})
    t.expect_equal(reason, "length", "finish_reason")
    t.expect(text.startswith('{"'), f"a cut object: {text!r}")


def bad_constraints():
    cases = [
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nope"}}}},
         "response_format.json_schema.schema"),
        ({"extra_body": {"guided_regex": "(unclosed"}}, "guided_regex"),
        ({"extra_body": {"guided_choice": []}}, "guided_choice"),
        ({"extra_body": {"guided_json": PERSON, "guided_regex": "a"}}, "guided_regex"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
         "tool_choice.function.name"),
    ]
    for kwargs, param in cases:
        try:
            chat(**kwargs)
        except openai.BadRequestError as error:
            t.expect_equal(error.status_code, 400, "status")
            t.expect_equal(error.body.get("param"), param, f"param of {error.body}")
            continue
        raise AssertionError(f"{kwargs} was accepted")


failed = t.run_checks([
    ("response_format json_schema (chat, n=2, streamed and not): outputs validate and finish",
     json_schema_chat),
    ("guided_json and structured_outputs.json (completions): outputs validate and finish", json_schema_completions),
    ("response_format json_object: an object, complete when finished", json_object),
    ("guided_choice: one of the choices", guided_choice),
    ("guided_regex and structured_outputs.regex: outputs fullmatch", guided_regex),
    ("tool_choice required: well-formed calls of known tools with valid arguments", tool_choice_required),
    ("tool_choice naming a function: one call of it with valid arguments", tool_choice_named),
    ("max_tokens cuts a constrained output: finish_reason length", max_tokens_cut),
    ("malformed constraints are 400s naming the field", bad_constraints),
])
t.finish(failed, target, f"structured-output checks against {TARGET}")

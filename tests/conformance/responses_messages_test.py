"""OpenAI's Responses API and Anthropic's Messages API end to end, with the official `openai`
and `anthropic` clients, against a colocated pdserve-decode or a 1P1D cluster behind
pdserve-proxy (argument: colocated | 1p1d). The server has an API key: the OpenAI client sends
it as a bearer, the Anthropic client as x-api-key.

Both APIs are translations of a chat completion, so the oracle is the same request sent as a
chat completion: with greedy sampling the translated answer must carry exactly the chat
answer's text, reasoning, tool calls, finish reason and token counts. The node runs with
PDSERVE_TEST_SCRIPTED_OUTPUT=1 where an answer must end on its own or hold tool calls (the tiny
random model writes neither): a request's `pdserve_test_output` replaces its first tokens, and
everything else (template, engine, KV transfer, parsers, SSE, proxy relay) is the real path.
Streams are read with the clients' own stream helpers (responses.stream, messages.stream), and
the whole event sequence is checked in order as the client parsed it.
"""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "python"))
os.environ["PDSERVE_TEST_SCRIPTED_OUTPUT"] = "1"  # inherited by the nodes started below
import anthropic  # noqa: E402
import jsonschema  # noqa: E402
import openai  # noqa: E402

import pdserve_testing as t  # noqa: E402

t.set_deadline(200)
TARGET = sys.argv[1] if len(sys.argv) > 1 else "colocated"
API_KEY = "test-client-key"

model_dir = t.make_model()
if TARGET == "colocated":
    target = t.start_colocated(model_dir, ["--api-key", API_KEY])
else:
    target = t.start_1p1d(model_dir, proxy_extra=["--api-key", API_KEY])
oai = openai.OpenAI(base_url=target.url + "/v1", api_key=API_KEY, max_retries=0, timeout=60)
claude = anthropic.Anthropic(base_url=target.url, api_key=API_KEY, max_retries=0, timeout=60)
with open(os.path.join(t.SOURCE, "common/protocol/openapi.json"), encoding="utf-8") as handle:
    OPENAPI = json.load(handle)

SYSTEM = "You answer briefly."
QUESTION = "What is the weather in Paris, and the time there?"
REASONING = "The user wants the weather and the time in Paris."
CONTENT = "Let me look both up.\n\n"
CALLS = [("get_weather", {"city": "Paris", "unit": "celsius"}), ("get_time", {"timezone": "Europe/Paris"})]
PARAMETERS = {
    "get_weather": {"type": "object", "required": ["city"],
                    "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}},
    "get_time": {"type": "object", "required": ["timezone"], "properties": {"timezone": {"type": "string"}}},
}
CHAT_TOOLS = [{"type": "function", "function": {"name": n, "description": f"{n} of a place", "parameters": p}}
              for n, p in PARAMETERS.items()]
RESPONSES_TOOLS = [{"type": "function", "name": n, "description": f"{n} of a place", "parameters": p}
                   for n, p in PARAMETERS.items()]
ANTHROPIC_TOOLS = [{"name": n, "description": f"{n} of a place", "input_schema": p} for n, p in PARAMETERS.items()]
TOOL_SCRIPT = (f"<think>\n{REASONING}\n</think>\n\n{CONTENT}"
               + "\n".join("<tool_call>\n" + json.dumps({"name": n, "arguments": a}) + "\n</tool_call>" for n, a in CALLS)
               + "<|im_end|>")
PLAIN_SCRIPT = "<think>\nShort.\n</think>\n\nIt is sunny in Paris.<|im_end|>"
GREEDY = {"temperature": 0}


def scripted(script):
    return {"pdserve_test_output": script}


def chat(messages, script=None, **kwargs):
    """The oracle: the same request as a chat completion."""
    extra = scripted(script) if script else None
    return oai.chat.completions.create(model=target.name, messages=messages, extra_body=extra, **kwargs)


def chat_messages():
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}]


def validate(instance, schema_name):
    jsonschema.validate(instance, {"components": OPENAPI["components"], "$ref": f"#/components/schemas/{schema_name}"})


# ---------------------------------------------------------------- Responses API

def responses_whole_equals_chat():
    oracle = chat(chat_messages(), max_completion_tokens=12, **GREEDY)
    response = oai.responses.create(model=target.name, instructions=SYSTEM, input=QUESTION,
                                    max_output_tokens=12, **GREEDY)
    choice = oracle.choices[0]
    reasoning = choice.message.model_extra.get("reasoning_content")
    texts = [c.text for item in response.output if item.type == "message" for c in item.content]
    t.expect_equal(texts, [choice.message.content or ""], "message text")
    t.expect_equal(response.output_text, choice.message.content or "", "output_text")
    reasoning_items = [item for item in response.output if item.type == "reasoning"]
    t.expect_equal([c.text for item in reasoning_items for c in item.content], [reasoning] if reasoning else [],
                   "reasoning items")
    t.expect_equal((response.usage.input_tokens, response.usage.output_tokens),
                   (oracle.usage.prompt_tokens, oracle.usage.completion_tokens), "usage")
    want_status = "incomplete" if choice.finish_reason == "length" else "completed"
    t.expect_equal(response.status, want_status, "status")
    if want_status == "incomplete":
        t.expect_equal(response.incomplete_details.reason, "max_output_tokens", "incomplete reason")
    t.expect(response.id.startswith("resp_"), f"response id {response.id}")
    validate(response.model_dump(mode="json"), "Response")
    # A message list with input_text parts is the same prompt.
    listed = oai.responses.create(model=target.name, instructions=SYSTEM, max_output_tokens=12, **GREEDY,
                                  input=[{"role": "user", "content": [{"type": "input_text", "text": QUESTION}]}])
    t.expect_equal((listed.output_text, listed.usage.input_tokens), (response.output_text, response.usage.input_tokens),
                   "input as a message list")


def responses_stream_events():
    whole = oai.responses.create(model=target.name, input=QUESTION, extra_body=scripted(PLAIN_SCRIPT), **GREEDY)
    events = []
    with oai.responses.stream(model=target.name, input=QUESTION, extra_body=scripted(PLAIN_SCRIPT), **GREEDY) as stream:
        for event in stream:
            events.append(event)
        final = stream.get_final_response()
    types = [e.type for e in events]
    t.expect_equal([e.sequence_number for e in events], list(range(len(events))), "sequence numbers")
    t.expect_equal(types[:2], ["response.created", "response.in_progress"], "the stream's head")
    t.expect_equal(types[-1], "response.completed", "the stream's end")
    # Reasoning item, then the message, each complete before the next starts.
    reasoning, message = [i for i, e in enumerate(events) if e.type == "response.output_item.added"]
    t.expect_equal(events[reasoning].item.type, "reasoning", "first item")
    t.expect_equal(events[message].item.type, "message", "second item")
    middle = types[message:-1]
    t.expect_equal(middle[:2], ["response.output_item.added", "response.content_part.added"], "message opening")
    t.expect_equal(middle[-3:], ["response.output_text.done", "response.content_part.done", "response.output_item.done"],
                   "message closing")
    t.expect(set(middle[2:-3]) == {"response.output_text.delta"}, f"deltas between: {middle}")
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    t.expect_equal(deltas, "It is sunny in Paris.", "text deltas")
    t.expect_equal("".join(e.delta for e in events if e.type == "response.reasoning_text.delta"), "Short.",
                   "reasoning deltas")
    t.expect_equal(final.output_text, whole.output_text, "streamed final text = whole text")
    t.expect_equal(final.usage.output_tokens, whole.usage.output_tokens, "streamed usage")
    t.expect_equal([i.type for i in final.output], [i.type for i in whole.output], "output item types")
    # Cut by max_output_tokens: response.incomplete ends the stream.
    with oai.responses.stream(model=target.name, input=QUESTION, max_output_tokens=3, **GREEDY) as stream:
        last = [e for e in stream][-1]
    t.expect_equal((last.type, last.response.status, last.response.incomplete_details.reason),
                   ("response.incomplete", "incomplete", "max_output_tokens"), "a cut stream's end")


def responses_function_calls():
    oracle = chat([{"role": "user", "content": QUESTION}], TOOL_SCRIPT, tools=CHAT_TOOLS).choices[0].message
    response = oai.responses.create(model=target.name, input=QUESTION, tools=RESPONSES_TOOLS,
                                    extra_body=scripted(TOOL_SCRIPT))
    calls = [i for i in response.output if i.type == "function_call"]
    t.expect_equal([(c.name, c.arguments) for c in calls],
                   [(c.function.name, c.function.arguments) for c in oracle.tool_calls], "function calls")
    t.expect_equal([c.call_id for c in calls][0].startswith("call_"), True, "call ids")
    t.expect_equal([i.type for i in response.output], ["reasoning", "message", "function_call", "function_call"],
                   "output items")
    t.expect_equal(response.output_text, CONTENT, "text before the calls")
    deltas = {}
    with oai.responses.stream(model=target.name, input=QUESTION, tools=RESPONSES_TOOLS,
                              extra_body=scripted(TOOL_SCRIPT)) as stream:
        for event in stream:
            if event.type == "response.function_call_arguments.delta":
                deltas.setdefault(event.output_index, []).append(event.delta)
        final = stream.get_final_response()
    t.expect_equal([(i.name, i.arguments) for i in final.output if i.type == "function_call"],
                   [(c.name, c.arguments) for c in calls], "streamed function calls")
    t.expect_equal(["".join(d) for _, d in sorted(deltas.items())], [c.arguments for c in calls], "argument deltas")
    t.expect(all(len(d) > 1 for d in deltas.values()), "arguments arrive in several deltas")
    # The calls and their outputs as the next turn's input: the chat prompt of the same turns.
    history = [{"role": "user", "content": QUESTION}] + [
        {"type": "function_call", "call_id": c.call_id, "name": c.name, "arguments": c.arguments} for c in calls] + [
        {"type": "function_call_output", "call_id": c.call_id, "output": "18 C"} for c in calls]
    turn = oai.responses.create(model=target.name, input=history, tools=RESPONSES_TOOLS, max_output_tokens=4, **GREEDY)
    chat_history = [{"role": "user", "content": QUESTION},
                    {"role": "assistant", "content": "", "tool_calls": [
                        {"id": c.call_id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                        for c in calls]}] + [
        {"role": "tool", "tool_call_id": c.call_id, "content": "18 C"} for c in calls]
    oracle_turn = chat(chat_history, tools=CHAT_TOOLS, max_completion_tokens=4, **GREEDY)
    t.expect_equal((turn.usage.input_tokens, turn.output_text),
                   (oracle_turn.usage.prompt_tokens, oracle_turn.choices[0].message.content or ""),
                   "a turn after tool outputs")


def responses_json_schema():
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}}, "required": ["city"],
              "additionalProperties": False}
    oracle = chat([{"role": "user", "content": QUESTION}], max_completion_tokens=40, **GREEDY,
                  response_format={"type": "json_schema", "json_schema": {"name": "place", "schema": schema}})
    response = oai.responses.create(model=target.name, input=QUESTION, max_output_tokens=40, **GREEDY,
                                    text={"format": {"type": "json_schema", "name": "place", "schema": schema}})
    t.expect_equal(response.output_text, oracle.choices[0].message.content, "constrained text")
    if response.status == "completed":
        jsonschema.validate(json.loads(response.output_text), schema)


def responses_refusals():
    for kwargs, param in (({"store": True}, "store"), ({"previous_response_id": "resp_1"}, "previous_response_id"),
                          ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
                          ({"max_output_tokens": 0}, "max_output_tokens")):
        try:
            oai.responses.create(model=target.name, input="hi", **kwargs)
            raise AssertionError(f"{kwargs} was accepted")
        except openai.BadRequestError as error:
            t.expect_equal(error.body.get("param"), param, f"param of the 400 for {kwargs}")
    try:
        oai.responses.create(model="no-such-model", input="hi")
        raise AssertionError("an unknown model was accepted")
    except openai.NotFoundError:
        pass


# ---------------------------------------------------------------- Anthropic Messages API

def messages_whole_equals_chat():
    oracle = chat(chat_messages(), max_completion_tokens=12, **GREEDY)
    # The SDK no longer has temperature / top_p / top_k arguments: they go as extra fields.
    message = claude.messages.create(model=target.name, system=SYSTEM, max_tokens=12, extra_body=GREEDY,
                                     messages=[{"role": "user", "content": QUESTION}])
    choice = oracle.choices[0]
    texts = [b.text for b in message.content if b.type == "text"]
    t.expect_equal(texts, [choice.message.content or ""], "text")
    thinking = [b.thinking for b in message.content if b.type == "thinking"]
    reasoning = choice.message.model_extra.get("reasoning_content")
    t.expect_equal(thinking, [reasoning] if reasoning else [], "thinking")
    t.expect_equal((message.usage.input_tokens, message.usage.output_tokens),
                   (oracle.usage.prompt_tokens, oracle.usage.completion_tokens), "usage")
    t.expect_equal(message.stop_reason, {"length": "max_tokens", "stop": "end_turn"}[choice.finish_reason], "stop_reason")
    t.expect(message.id.startswith("msg_"), f"message id {message.id}")
    validate(message.model_dump(mode="json"), "AnthropicResponseMessage")
    count = claude.messages.count_tokens(model=target.name, system=SYSTEM, messages=[{"role": "user", "content": QUESTION}])
    t.expect_equal(count.input_tokens, oracle.usage.prompt_tokens, "count_tokens")


def messages_stream_events():
    whole = claude.messages.create(model=target.name, max_tokens=64, messages=[{"role": "user", "content": QUESTION}],
                                   extra_body=scripted(PLAIN_SCRIPT))
    with claude.messages.stream(model=target.name, max_tokens=64, messages=[{"role": "user", "content": QUESTION}],
                                extra_body=scripted(PLAIN_SCRIPT)) as stream:
        events = [e for e in stream if e.type in ("message_start", "content_block_start", "content_block_delta",
                                                  "content_block_stop", "message_delta", "message_stop")]
        final = stream.get_final_message()
    types = [e.type for e in events]
    t.expect_equal(types[0], "message_start", "first event")
    t.expect_equal(types[-2:], ["message_delta", "message_stop"], "last events")
    blocks = []  # (index, type, deltas) per block, in order
    for e in events[1:-2]:
        if e.type == "content_block_start":
            t.expect(not blocks or blocks[-1][3], f"block {e.index} starts before the last one stopped")
            blocks.append([e.index, e.content_block.type, [], False])
        elif e.type == "content_block_delta":
            t.expect_equal((e.index, blocks[-1][3]), (blocks[-1][0], False), "a delta of the open block")
            blocks[-1][2].append(e.delta.thinking if e.delta.type == "thinking_delta" else e.delta.text)
        else:
            t.expect_equal((e.type, e.index), ("content_block_stop", blocks[-1][0]), "block stop")
            blocks[-1][3] = True
    t.expect_equal([(i, kind, "".join(d), done) for i, kind, d, done in blocks],
                   [(0, "thinking", "Short.", True), (1, "text", "It is sunny in Paris.", True)], "blocks")
    t.expect_equal(events[0].message.usage.input_tokens, whole.usage.input_tokens, "message_start usage")
    t.expect_equal((final.stop_reason, final.usage.output_tokens), ("end_turn", whole.usage.output_tokens), "final")
    t.expect_equal([b.model_dump() for b in final.content], [b.model_dump() for b in whole.content], "final content")


def messages_tool_use():
    oracle = chat([{"role": "user", "content": QUESTION}], TOOL_SCRIPT, tools=CHAT_TOOLS).choices[0].message
    message = claude.messages.create(model=target.name, max_tokens=200, tools=ANTHROPIC_TOOLS,
                                     messages=[{"role": "user", "content": QUESTION}], extra_body=scripted(TOOL_SCRIPT))
    t.expect_equal([b.type for b in message.content], ["thinking", "text", "tool_use", "tool_use"], "blocks")
    uses = [b for b in message.content if b.type == "tool_use"]
    t.expect_equal([(b.name, b.input) for b in uses],
                   [(c.function.name, json.loads(c.function.arguments)) for c in oracle.tool_calls], "tool_use blocks")
    t.expect_equal((message.content[0].thinking, message.content[1].text, message.stop_reason),
                   (REASONING, CONTENT, "tool_use"), "thinking, text, stop_reason")
    partial = {}
    with claude.messages.stream(model=target.name, max_tokens=200, tools=ANTHROPIC_TOOLS, extra_body=scripted(TOOL_SCRIPT),
                                messages=[{"role": "user", "content": QUESTION}]) as stream:
        for event in stream:
            if event.type == "content_block_delta" and event.delta.type == "input_json_delta":
                partial.setdefault(event.index, []).append(event.delta.partial_json)
        final = stream.get_final_message()
    t.expect_equal([(b.name, b.input) for b in final.content if b.type == "tool_use"],
                   [(b.name, b.input) for b in uses], "streamed tool_use blocks")
    t.expect(len(partial) == 2 and all(len(p) > 1 for p in partial.values()), f"input_json_delta pieces: {partial}")
    # The calls and their results as the next turn: the chat prompt of the same turns.
    turns = [{"role": "user", "content": QUESTION},
             {"role": "assistant", "content": [{"type": "text", "text": CONTENT}] + [
                 {"type": "tool_use", "id": b.id, "name": b.name, "input": b.input} for b in uses]},
             {"role": "user", "content": [{"type": "tool_result", "tool_use_id": b.id, "content": "18 C"} for b in uses]}]
    chat_turns = [{"role": "user", "content": QUESTION},
                  {"role": "assistant", "content": CONTENT, "tool_calls": [
                      {"id": b.id, "type": "function", "function": {"name": b.name, "arguments": json.dumps(b.input)}}
                      for b in uses]}] + [{"role": "tool", "tool_call_id": b.id, "content": "18 C"} for b in uses]
    oracle_turn = chat(chat_turns, tools=CHAT_TOOLS, max_completion_tokens=4, **GREEDY)
    turn = claude.messages.create(model=target.name, max_tokens=4, extra_body=GREEDY, tools=ANTHROPIC_TOOLS,
                                  messages=turns)
    t.expect_equal((turn.usage.input_tokens, [b.text for b in turn.content if b.type == "text"]),
                   (oracle_turn.usage.prompt_tokens, [oracle_turn.choices[0].message.content or ""]),
                   "a turn after tool results")
    count = claude.messages.count_tokens(model=target.name, tools=ANTHROPIC_TOOLS, messages=turns)
    t.expect_equal(count.input_tokens, oracle_turn.usage.prompt_tokens, "count_tokens with tools and results")


def messages_stop_sequences():
    script = "Sunny, then RAIN later.<|im_end|>"
    message = claude.messages.create(model=target.name, max_tokens=40, stop_sequences=["RAIN"],
                                     messages=[{"role": "user", "content": QUESTION}], extra_body=scripted(script))
    t.expect_equal((message.content[0].text, message.stop_reason, message.stop_sequence),
                   ("Sunny, then ", "stop_sequence", "RAIN"), "stopped by a stop sequence")
    with claude.messages.stream(model=target.name, max_tokens=40, stop_sequences=["RAIN"], extra_body=scripted(script),
                                messages=[{"role": "user", "content": QUESTION}]) as stream:
        final = stream.get_final_message()
    t.expect_equal((final.stop_reason, final.stop_sequence), ("stop_sequence", "RAIN"), "streamed stop sequence")


def messages_output_config_json_schema():
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}}, "required": ["city"],
              "additionalProperties": False}
    oracle = chat([{"role": "user", "content": QUESTION}], max_completion_tokens=40, **GREEDY,
                  response_format={"type": "json_schema", "json_schema": {"name": "output", "schema": schema}})
    message = claude.messages.create(model=target.name, max_tokens=40, extra_body=GREEDY,
                                     output_config={"format": {"type": "json_schema", "schema": schema}},
                                     messages=[{"role": "user", "content": QUESTION}])
    t.expect_equal([b.text for b in message.content if b.type == "text"], [oracle.choices[0].message.content],
                   "constrained text")
    if message.stop_reason == "end_turn":
        jsonschema.validate(json.loads(message.content[-1].text), schema)


def messages_errors_and_auth():
    try:
        claude.messages.create(model=target.name, max_tokens=0, messages=[{"role": "user", "content": "hi"}])
        raise AssertionError("max_tokens 0 was accepted")
    except anthropic.BadRequestError as error:
        t.expect_equal(error.body["type"], "error", "error shape")
        t.expect_equal(error.body["error"]["type"], "invalid_request_error", "error type")
        t.expect("max_tokens" in error.body["error"]["message"], f"names the field: {error.body}")
    status, text = t.http("POST", target.url + "/v1/messages", {"model": target.name, "messages": []},
                          headers={"x-api-key": API_KEY})
    t.expect_equal(status, 400, f"missing max_tokens: {text}")
    try:
        claude.messages.create(model="no-such-model", max_tokens=4, messages=[{"role": "user", "content": "hi"}])
        raise AssertionError("an unknown model was accepted")
    except anthropic.NotFoundError as error:
        t.expect_equal(error.body["error"]["type"], "not_found_error", "404 type")
    wrong = anthropic.Anthropic(base_url=target.url, api_key="wrong", max_retries=0, timeout=30)
    try:
        wrong.messages.create(model=target.name, max_tokens=4, messages=[{"role": "user", "content": "hi"}])
        raise AssertionError("a wrong key was accepted")
    except anthropic.AuthenticationError as error:
        t.expect_equal(error.body["error"]["type"], "authentication_error", "401 type")
    for path in ("/v1/messages", "/v1/responses", "/v1/chat/completions"):
        status, text = t.http("POST", target.url + path, {"model": target.name})
        t.expect_equal(status, 401, f"{path} without a key: {text}")
    # x-api-key works on the OpenAI routes too.
    status, text = t.http("POST", target.url + "/v1/chat/completions",
                          {"model": target.name, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]},
                          headers={"x-api-key": API_KEY})
    t.expect_equal(status, 200, f"chat with x-api-key: {text[:200]}")


failed = t.run_checks([
    ("responses.create equals the chat completion of the same prompt", responses_whole_equals_chat),
    ("responses.stream: the typed event sequence, in order", responses_stream_events),
    ("responses: function calls, streamed argument deltas, tool outputs as input", responses_function_calls),
    ("responses: text.format json_schema goes through the grammar", responses_json_schema),
    ("responses: store, previous_response_id, other tools and bad values are 400s", responses_refusals),
    ("messages.create equals the chat completion of the same prompt; count_tokens", messages_whole_equals_chat),
    ("messages.stream: Anthropic's event sequence, in order", messages_stream_events),
    ("messages: tool_use blocks, input_json_delta, tool_result turns", messages_tool_use),
    ("messages: stop_sequences give stop_reason stop_sequence", messages_stop_sequences),
    ("messages: output_config.format json_schema goes through the grammar", messages_output_config_json_schema),
    ("messages: errors in Anthropic's shape, x-api-key and bearer auth", messages_errors_and_auth),
])
t.finish(failed, target, "Responses and Messages API checks")

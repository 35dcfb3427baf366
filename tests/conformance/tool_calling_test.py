"""Tool calling end to end with the official `openai` client, against a colocated pdserve-decode
or a 1P1D cluster behind pdserve-proxy (argument: colocated | 1p1d).

The tiny model has random weights and never writes a tool call itself, so its decode node runs
with PDSERVE_TEST_SCRIPTED_OUTPUT=1: a request's `pdserve_test_output` text, tokenized, replaces
the first sampled tokens (SamplingParams::scripted_output). Everything else is the real path:
prompt rendering with the tools, the engine (and in 1P1D the prefill node, which samples the
first token under the same script, and the KV transfer), the detokenizer, the reasoning and
tool-call parsers, SSE, the proxy's relay. Checked:
  * whole answers: message.tool_calls (ids, type, names), content before the calls, reasoning,
    finish_reason tool_calls; arguments valid against each tool's parameters (jsonschema);
  * streams, accumulated by the client's own ChatCompletionStreamState (chat.completions.stream),
    equal the whole answers; the chunks follow the OpenAPI document's ToolCallDelta schema; each
    call is announced (index, id, type, name) in its first entry and its arguments come in
    several more, as the tokens arrive, concatenating to exactly the whole answer's string;
  * tool_choice none and requests without tools leave the text alone; malformed and unterminated
    calls stay content (streamed, a call announced before its block went wrong stays in the
    stream as sent, and finish_reason says whether any call completed); a call to a function
    that is not in `tools` is returned (as vLLM);
  * a conversation with the calls and their results renders as transformers renders it with the
    arguments as objects (vLLM's json.loads): the prompt token counts agree;
  * a stream resumed on the decode node after any of its events (the proxy's failover, replayed
    through the parsers) continues with exactly the events of the uninterrupted stream.
"""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "python"))
os.environ["PDSERVE_TEST_SCRIPTED_OUTPUT"] = "1"  # inherited by the nodes started below
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
import jsonschema  # noqa: E402
import openai  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402

import pdserve_testing as t  # noqa: E402

t.set_deadline(200)
TARGET = sys.argv[1] if len(sys.argv) > 1 else "colocated"

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "The weather in a city.",
        "parameters": {"type": "object", "additionalProperties": False, "required": ["city"],
                       "properties": {"city": {"type": "string"},
                                      "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                                      "days": {"type": "integer", "minimum": 1}}}}},
    {"type": "function", "function": {
        "name": "get_time", "description": "The time in a time zone.",
        "parameters": {"type": "object", "additionalProperties": False, "required": ["timezone"],
                       "properties": {"timezone": {"type": "string"}}}}},
]
TOOL_CALL_START, TOOL_CALL_END = 151657, 151658  # the ids of <tool_call> and </tool_call>
SCHEMAS = {tool["function"]["name"]: tool["function"]["parameters"] for tool in TOOLS}
MESSAGES = [{"role": "user", "content": "What is the weather in Paris, and the time there?"}]
REASONING = "The user wants the weather and the time in Paris."
CONTENT = "Let me look both up.\n\n"
CALLS = [("get_weather", {"city": "Paris", "unit": "celsius", "days": 2}),
         ("get_time", {"timezone": "Europe/Paris"})]


def call_block(name, arguments):
    """A call as Qwen3's template writes one (json.dumps spacing, non-ASCII kept)."""
    return ("<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
            + "\n</tool_call>")


SCRIPT = (f"<think>\n{REASONING}\n</think>\n\n{CONTENT}" + "\n".join(call_block(*c) for c in CALLS)
          + "<|im_end|>")

model_dir = t.make_model()
target = t.start_target(TARGET, model_dir)
client = openai.OpenAI(base_url=target.url + "/v1", api_key="x", max_retries=0, timeout=60)
with open(os.path.join(t.SOURCE, "common/protocol/openapi.json"), encoding="utf-8") as handle:
    OPENAPI = json.load(handle)


def scripted(script, **extra):
    return {"pdserve_test_output": script, **extra}


def chat(script, **kwargs):
    kwargs.setdefault("tools", TOOLS)
    return client.chat.completions.create(model=target.name, messages=kwargs.pop("messages", MESSAGES),
                                          extra_body=scripted(script), **kwargs)


def streamed(script, **kwargs):
    """The final completion as the openai client's stream helper accumulates it, and the raw chunks."""
    kwargs.setdefault("tools", TOOLS)
    chunks = []
    with client.chat.completions.stream(model=target.name, messages=kwargs.pop("messages", MESSAGES),
                                        extra_body=scripted(script), **kwargs) as stream:
        for event in stream:
            if event.type == "chunk":
                chunks.append(event.chunk.model_dump(exclude_unset=True))
        return stream.get_final_completion(), chunks


def check_calls(message):
    """The scripted calls, arguments valid against their tool's parameters; returns the ids."""
    calls = message.tool_calls or []
    t.expect_equal([(c.function.name, json.loads(c.function.arguments)) for c in calls],
                   [(name, arguments) for name, arguments in CALLS], "tool calls")
    for call in calls:
        t.expect_equal(call.type, "function", "tool call type")
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])
    ids = [call.id for call in calls]
    t.expect(all(i.startswith("call_") for i in ids) and len(set(ids)) == len(ids), f"ids {ids}")
    return ids


def whole_answer():
    response = chat(SCRIPT)
    choice = response.choices[0]
    t.expect_equal(choice.finish_reason, "tool_calls", "finish_reason")
    t.expect_equal(choice.message.content, CONTENT, "content before the calls")
    t.expect_equal(choice.message.model_extra.get("reasoning_content"), REASONING, "reasoning_content")
    ids = check_calls(choice.message)
    again = check_calls(chat(SCRIPT).choices[0].message)
    t.expect(not set(ids) & set(again), "tool call ids differ between responses")


def streamed_answer():
    whole = chat(SCRIPT).choices[0].message
    final, chunks = streamed(SCRIPT)
    choice = final.choices[0]
    t.expect_equal(choice.finish_reason, "tool_calls", "streamed finish_reason")
    t.expect_equal(choice.message.content, CONTENT, "streamed content")
    check_calls(choice.message)
    # The arguments strings, as the client accumulated them, are the whole answer's exactly.
    t.expect_equal([c.function.arguments for c in choice.message.tool_calls],
                   [c.function.arguments for c in whole.tool_calls], "accumulated arguments")
    schema = {"components": OPENAPI["components"], "$ref": "#/components/schemas/ChatCompletionChunk"}
    entries = {}
    for chunk in chunks:
        jsonschema.validate(chunk, schema)
        for entry in chunk["choices"][0]["delta"].get("tool_calls") or []:
            entries.setdefault(entry["index"], []).append(entry)
    t.expect_equal(sorted(entries), [0, 1], "streamed call indices")
    for index, (first, *rest) in entries.items():
        t.expect({"id", "type"} <= first.keys() and "name" in first["function"],
                 f"the first entry of a call carries id, type and name: {first}")
        t.expect(all(e.keys() == {"index", "function"} and e["function"].keys() == {"arguments"}
                     for e in rest), f"later entries of call {index} carry only arguments: {rest}")
        arguments = [e["function"].get("arguments", "") for e in [first] + rest]
        t.expect(len([a for a in arguments if a]) > 1,
                 f"call {index}'s arguments arrive in more than one chunk: {arguments}")
        t.expect_equal("".join(arguments), whole.tool_calls[index].function.arguments,
                       f"call {index}'s fragments concatenate to the whole answer's arguments")


def not_parsed():
    text = SCRIPT.split("</think>\n\n", 1)[1].removesuffix("<|im_end|>")
    for kwargs in ({"tool_choice": "none"}, {"tools": openai.NOT_GIVEN}):
        choice = chat(SCRIPT, **kwargs).choices[0]
        t.expect_equal((choice.finish_reason, choice.message.content, choice.message.tool_calls),
                       ("stop", text, None), f"answer with {kwargs}")
        final, _ = streamed(SCRIPT, **kwargs)
        t.expect_equal((final.choices[0].message.content, final.choices[0].message.tool_calls),
                       (text, None), f"streamed answer with {kwargs}")


def malformed_stays_content():
    bad = ('Sure.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": }\n</tool_call>\n'
           '<tool_call>\n{"name": "get_time", "arguments": {"timezone": "UTC"}')
    whole = chat(bad + "<|im_end|>").choices[0]
    t.expect_equal((whole.finish_reason, whole.message.content, whole.message.tool_calls),
                   ("stop", bad, None), "malformed calls")
    # Streamed, each call was announced, and got its arguments, before its block went wrong (bad
    # JSON; no end tag before the end): nothing can be taken back. The blocks still come as
    # content, so the content is the whole answer's, and finish_reason says no call completed.
    final, _ = streamed(bad + "<|im_end|>")
    choice = final.choices[0]
    t.expect_equal((choice.finish_reason, choice.message.content), ("stop", bad), "streamed malformed calls")
    t.expect_equal([(c.function.name, c.function.arguments) for c in choice.message.tool_calls],
                   [("get_weather", '{"city": '), ("get_time", '{"timezone": "UTC"}')],
                   "announced calls stay as they were sent")


def unknown_function_is_returned():
    script = "<tool_call>\n" + json.dumps({"name": "launch", "arguments": {"at": "noon"}}) + "\n</tool_call><|im_end|>"
    # Streamed, the role chunk's "content": "" (as vLLM's) starts the accumulated content.
    for response, no_content in ((chat(script), None), (streamed(script)[0], "")):
        choice = response.choices[0]
        t.expect_equal(choice.finish_reason, "tool_calls", "finish_reason")
        t.expect_equal(choice.message.content, no_content, "content of an answer that is only a call")
        t.expect_equal([(c.function.name, c.function.arguments) for c in choice.message.tool_calls],
                       [("launch", '{"at": "noon"}')], "the call to a function outside tools")


def tool_results_render_like_transformers():
    calls = [{"id": f"call_{i}", "type": "function",
              "function": {"name": name, "arguments": json.dumps(arguments, separators=(",", ":"))}}
             for i, (name, arguments) in enumerate(CALLS)]
    conversation = MESSAGES + [
        {"role": "assistant", "content": CONTENT, "tool_calls": calls},
        {"role": "tool", "tool_call_id": "call_0", "content": '{"temperature": 18}'},
        {"role": "tool", "tool_call_id": "call_1", "content": "14:05"}]
    response = chat("It is 18 °C and 14:05.<|im_end|>", messages=conversation)
    t.expect_equal(response.choices[0].message.content, "It is 18 °C and 14:05.", "the answer")
    tokenizer = AutoTokenizer.from_pretrained(os.path.join(t.SOURCE, "configs/models/qwen3-tokenizer"))

    def hf_count(objects):
        messages = json.loads(json.dumps(conversation))
        for call in messages[1]["tool_calls"]:
            if objects:
                call["function"]["arguments"] = json.loads(call["function"]["arguments"])
        ids = tokenizer.apply_chat_template(messages, tools=TOOLS, add_generation_prompt=True, tokenize=True)
        return len(ids["input_ids"] if hasattr(ids, "keys") else ids)

    t.expect(hf_count(True) != hf_count(False), "the check tells object from string arguments apart")
    t.expect_equal(response.usage.prompt_tokens, hf_count(True), "prompt tokens (transformers, objects)")


def resumed_streams_continue_exactly():
    """What the proxy does when a decode node fails: resume after each event in turn."""
    url = target.decode.match.group(2) + "/v1/chat/completions"
    headers = dict(t.cluster_headers(), **{"X-Pdserve-Resumable": "1"})
    # With logprobs every token makes an event, so the stream can also be resumed inside a call,
    # whose tokens the parser holds back: the resuming node must replay them into the parser.
    body = {"model": target.name, "messages": MESSAGES, "tools": TOOLS, "stream": True,
            "logprobs": True, **scripted(SCRIPT)}
    status, text = t.http("POST", url, body, headers=headers)
    t.expect_equal(status, 200, f"resumable stream: {text[:300]}")
    events, tokens, state, head = [], [], None, None
    for raw in text.split("\n\n"):
        if raw.startswith(": pdserve_resume "):
            checkpoint = json.loads(raw[len(": pdserve_resume "):])
            head = head or checkpoint
            tokens = tokens + checkpoint["token_ids"]
            state = checkpoint.get("sampler_state", state)
        elif raw.startswith("data: "):
            events.append((raw, list(tokens), state))
    t.expect(events[-1][0] == "data: [DONE]", "the stream ends with [DONE]")
    t.expect(any('"tool_calls":[' in raw for raw, _, _ in events), "the stream has tool calls")
    resumed_points = inside_calls = resumed_at_the_end = 0
    for i, (raw, delivered, sampler_state) in enumerate(events[:-1]):
        if '"finish_reason":"' in raw:
            break  # the proxy resumes no stream whose end the client has
        # After the last token's event but before the finish chunk, nothing is left to
        # generate: the resuming node sends the finish chunk (tool_calls: its parser caught up).
        resumed_at_the_end += len(delivered) == len(events[-1][1])
        if not delivered:
            continue
        resume = {"id": head["id"], "created": head["created"],
                  "choices": [{"index": 0, "output_token_ids": delivered, "sampler_state": sampler_state}]}
        status, rest = t.http("POST", url, dict(body, pdserve_resume=resume), headers=t.cluster_headers())
        t.expect_equal(status, 200, f"resume after event {i}: {rest[:300]}")
        got = [raw for raw in rest.split("\n\n") if raw.startswith("data: ")]
        want = [raw for raw, _, _ in events[i + 1:]]
        if got != want:
            first = next((k for k, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
            raise AssertionError(
                f"events after a resume after event {i} ({len(delivered)} tokens delivered): "
                f"{len(got)} events, expected {len(want)}; the first difference at {first}: "
                f"got {got[first] if first < len(got) else None!r}, "
                f"expected {want[first] if first < len(want) else None!r}")
        resumed_points += 1
        inside_calls += delivered.count(TOOL_CALL_START) > delivered.count(TOOL_CALL_END)
    t.expect(resumed_points > 50 and inside_calls > 20 and resumed_at_the_end == 1,
             f"resumed at {resumed_points} points, {inside_calls} inside a call, "
             f"{resumed_at_the_end} before the finish chunk only")


failed = t.run_checks([
    ("tool calls: message.tool_calls valid against the tools, content before them, finish_reason", whole_answer),
    ("streamed tool calls: the client's accumulation equals the whole answer; chunk shapes", streamed_answer),
    ("tool_choice none and no tools: the text is left alone, streamed or not", not_parsed),
    ("malformed and unterminated calls stay content", malformed_stays_content),
    ("a call to a function outside tools is returned, content null", unknown_function_is_returned),
    ("tool calls and results render back like transformers (arguments as objects)",
     tool_results_render_like_transformers),
    ("a stream resumed after any event continues with the uninterrupted stream's events",
     resumed_streams_continue_exactly),
])
t.finish(failed, target, f"tool-calling checks against {TARGET}")

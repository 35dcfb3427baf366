"""Conformance with the official `openai` Python client, against a colocated pdserve-decode or
a 1P1D cluster behind pdserve-proxy (argument: colocated | 1p1d): completions and chat,
streaming and not, stop strings, usage (stream_options.include_usage), n, echo, token-id and
list prompts, logprobs (checked by their properties: no oracle holds the tiny model's
probabilities), /v1/models, errors as openai.APIError, and a clean SIGTERM with a stream in
flight. Greedy texts are checked against pdserve-generate (no batching, no scheduler, no HTTP,
no cluster) on the same checkpoint.
"""
import math
import re
import sys
import time
import os

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "python"))
import openai  # noqa: E402
import pdserve_testing as t  # noqa: E402

t.set_deadline(200)
TARGET = sys.argv[1] if len(sys.argv) > 1 else "colocated"

MAX_TOKENS = 24
PROMPT = "The quick brown fox jumps"
OTHER_PROMPT = "Hello"
PROMPT_IDS = [1000, 2000, 3000, 4000, 5000, 6000, 7]
CHAT_QUESTION = "Hi there"
SYSTEM = "You are terse."
GREEDY = {"max_tokens": MAX_TOKENS, "temperature": 0}
IGNORE_EOS = {"ignore_eos": True}
# Qwen3's template defaults to thinking; pdserve-generate --chat defaults to not thinking.
NO_THINKING = {"ignore_eos": True, "chat_template_kwargs": {"enable_thinking": False}}

model_dir = t.make_model()
expected = t.generate_greedy(model_dir, PROMPT, MAX_TOKENS)
expected_other = t.generate_greedy(model_dir, OTHER_PROMPT, MAX_TOKENS)
expected_from_ids = t.generate_greedy(model_dir, PROMPT_IDS, MAX_TOKENS)
expected_chat = t.generate_greedy(model_dir, CHAT_QUESTION, MAX_TOKENS, ["--chat"])
expected_thinking = t.generate_greedy(model_dir, CHAT_QUESTION, MAX_TOKENS,
                                      ["--chat", "--enable-thinking", "--system", SYSTEM])
target = t.start_target(TARGET, model_dir)
# Retries off: a retried request would hide the status the server answered.
client = openai.OpenAI(base_url=target.url + "/v1", api_key="x", max_retries=0, timeout=60)
model = target.name
chat_messages = [{"role": "user", "content": CHAT_QUESTION}]


def complete(**kwargs):
    extra = kwargs.pop("extra_body", IGNORE_EOS)
    return client.completions.create(model=kwargs.pop("model", model), extra_body=extra, **kwargs)


def chat(**kwargs):
    extra = kwargs.pop("extra_body", NO_THINKING)
    return client.chat.completions.create(model=kwargs.pop("model", model), extra_body=extra, **kwargs)


def collect(stream):
    """Reads a stream to its end (the client stops at `data: [DONE]`)."""
    return list(stream)


def check_usage(usage, prompt_tokens, completion_tokens):
    t.expect(usage is not None, "usage is missing")
    if prompt_tokens is not None:
        t.expect_equal(usage.prompt_tokens, prompt_tokens, "prompt_tokens")
    t.expect(usage.prompt_tokens > 0, "prompt_tokens > 0")
    t.expect_equal(usage.completion_tokens, completion_tokens, "completion_tokens")
    t.expect_equal(usage.total_tokens, usage.prompt_tokens + usage.completion_tokens, "total_tokens")


def usage_counts(usage, completion_tokens):
    """The token counts of a usage object. Its pdserve_timeline extension (per-request timings,
    different for every request), where present, is checked for shape and left out."""
    t.expect(usage is not None, "usage is missing")
    counts = usage.model_dump(exclude_none=True)
    timeline = counts.pop("pdserve_timeline", None)
    if timeline is not None:
        t.expect(isinstance(timeline.get("spans"), list), "usage.pdserve_timeline with its spans")
        t.expect_equal(len(timeline["tokens_ms"]), completion_tokens, "pdserve_timeline.tokens_ms: one per token")
        t.expect(0 <= timeline["ttft_ms"] <= timeline["e2e_ms"], "pdserve_timeline: 0 <= ttft_ms <= e2e_ms")
    return counts


def split_completion_stream(chunks):
    """Text per choice index, the finish reasons, and the usage-only last chunk."""
    texts, finish_reasons, usage = {}, {}, None
    first_id = chunks[0].id
    for position, chunk in enumerate(chunks):
        t.expect_equal(chunk.object, "text_completion", "chunk object")
        t.expect_equal(chunk.id, first_id, "every chunk carries the same id")
        t.expect_equal(chunk.model, model, "chunk model")
        if chunk.usage is not None:
            t.expect_equal(position, len(chunks) - 1, "usage comes in the last chunk")
            t.expect_equal(chunk.choices, [], "the usage chunk has no choices")
            usage = chunk.usage
            continue
        for choice in chunk.choices:
            t.expect(choice.index not in finish_reasons, f"choice {choice.index} went on after its finish")
            texts[choice.index] = texts.get(choice.index, "") + choice.text
            if choice.finish_reason:
                finish_reasons[choice.index] = choice.finish_reason
    return [texts[i] for i in sorted(texts)], [finish_reasons[i] for i in sorted(finish_reasons)], usage


def split_chat_stream(chunks):
    contents, finish_reasons, roles, usage = {}, {}, {}, None
    for position, chunk in enumerate(chunks):
        t.expect_equal(chunk.object, "chat.completion.chunk", "chunk object")
        if chunk.usage is not None:
            t.expect_equal(position, len(chunks) - 1, "usage comes in the last chunk")
            t.expect_equal(chunk.choices, [], "the usage chunk has no choices")
            usage = chunk.usage
            continue
        for choice in chunk.choices:
            t.expect(choice.index not in finish_reasons, f"choice {choice.index} went on after its finish")
            if choice.delta.role:
                roles[choice.index] = choice.delta.role
            contents[choice.index] = contents.get(choice.index, "") + (choice.delta.content or "")
            if choice.finish_reason:
                finish_reasons[choice.index] = choice.finish_reason
    ordered = lambda d: [d[i] for i in sorted(d)]  # noqa: E731
    return ordered(contents), ordered(finish_reasons), ordered(roles), usage


def pick_stop_string(text):
    """Four ASCII letters or digits from the middle of the greedy text, so that the expected
    output (the text before its first occurrence) is unambiguous."""
    match = re.search(r"[A-Za-z0-9]{4}", text[8:])
    t.expect(match is not None, f"no ASCII run to stop at in {text!r}")
    stop = match.group(0)
    return stop, text[:text.index(stop)]


def token_bytes(token):
    """OpenAI spells a token that is not valid UTF-8 on its own as 'bytes:\\xe4\\xbd'."""
    if not token.startswith("bytes:"):
        return token.encode()
    escaped = token[len("bytes:"):]
    t.expect(re.fullmatch(r"(\\x[0-9a-f]{2})+", escaped) is not None, f"malformed byte token {token}")
    return bytes.fromhex(escaped.replace("\\x", ""))


def check_logprob(value, what):
    t.expect(isinstance(value, float) and math.isfinite(value) and value <= 0, f"{what} = {value}")


def check_completion_logprobs(logprobs, text, completion_tokens, top_k):
    t.expect(logprobs is not None, "logprobs were asked for")
    tokens, values, tops, offsets = logprobs.tokens, logprobs.token_logprobs, logprobs.top_logprobs, logprobs.text_offset
    for values_list in (tokens, values, tops, offsets):
        t.expect_equal(len(values_list), completion_tokens, "logprobs list length")
    t.expect_equal(b"".join(map(token_bytes, tokens)).decode(), text, "the tokens spell the text")
    t.expect_equal(offsets[0], 0, "text_offset[0]")
    for i, token in enumerate(tokens):
        check_logprob(values[i], f"token_logprobs[{i}]")
        if i > 0:
            t.expect(offsets[i] >= offsets[i - 1], "text_offset never decreases")
        alternatives = tops[i]
        t.expect(1 <= len(alternatives) <= top_k + 1, f"top_logprobs[{i}] size")
        for name, value in alternatives.items():
            check_logprob(value, f"top_logprobs[{i}][{name}]")
        t.expect(abs(values[i] - max(alternatives.values())) < 1e-5, f"greedy token {i} is not the most likely one")
        t.expect(abs(alternatives[token] - values[i]) < 1e-5, f"token {i} is missing from its top_logprobs")
    t.expect(offsets[-1] < len(text), "text_offset stays inside the text")


def check_chat_logprobs(content, text, completion_tokens, top_k):
    t.expect(isinstance(content, list), "logprobs.content was asked for")
    t.expect_equal(len(content), completion_tokens, "logprobs.content length")
    for entry in content:
        check_logprob(entry.logprob, f"logprob of {entry.token}")
        t.expect_equal(bytes(entry.bytes), token_bytes(entry.token), "bytes match the token")
        t.expect_equal(len(entry.top_logprobs), top_k, "top_logprobs size")
        for i, top in enumerate(entry.top_logprobs):
            check_logprob(top.logprob, "top logprob")
            t.expect_equal(bytes(top.bytes), token_bytes(top.token), "top bytes match the token")
            if i > 0:
                t.expect(top.logprob <= entry.top_logprobs[i - 1].logprob, "top_logprobs are sorted")
        t.expect_equal(entry.top_logprobs[0].token, entry.token, "greedy picks the most likely token")
        t.expect(abs(entry.top_logprobs[0].logprob - entry.logprob) < 1e-5, "top logprob equals the token's")
    t.expect_equal(b"".join(bytes(entry.bytes) for entry in content).decode(), text, "the bytes spell the content")


def expect_api_error(request, status, error_class=None, **fields):
    try:
        request()
    except openai.APIStatusError as error:
        t.expect_equal(error.status_code, status, f"status of {error.message}")
        body = error.body
        t.expect(isinstance(body, dict) and isinstance(body.get("message"), str) and body["message"],
                 f"error.message in {body}")
        for key in ("type", "param", "code"):
            t.expect(key in body, f"the error body has no '{key}': {body}")
        for key, value in fields.items():
            t.expect_equal(getattr(error, key), value, key)
        if error_class is not None:
            t.expect(isinstance(error, error_class), f"{type(error).__name__} is not a {error_class.__name__}")
        return error
    raise AssertionError(f"expected an HTTP {status} error, got a response")


def models_list():
    page = client.models.list()
    t.expect_equal([m.id for m in page.data], [model], "served models")
    t.expect_equal(page.data[0].object, "model", "object")
    t.expect(isinstance(page.data[0].created, int), "created is a number")


def completion_equals_generate():
    response = complete(prompt=PROMPT, **GREEDY)
    t.expect_equal(response.object, "text_completion", "object")
    t.expect(response.id.startswith("cmpl-"), f"id {response.id}")
    t.expect_equal(response.model, model, "model")
    t.expect_equal([(c.index, c.text, c.finish_reason) for c in response.choices], [(0, expected, "length")],
                   "choices")
    check_usage(response.usage, None, MAX_TOKENS)


def streamed_completion():
    plain = complete(prompt=PROMPT, **GREEDY)
    chunks = collect(complete(prompt=PROMPT, **GREEDY, stream=True, stream_options={"include_usage": True}))
    texts, finish_reasons, usage = split_completion_stream(chunks)
    t.expect_equal(texts, [expected], "streamed text")
    t.expect_equal(finish_reasons, ["length"], "finish reasons")
    t.expect_equal(usage_counts(usage, MAX_TOKENS), usage_counts(plain.usage, MAX_TOKENS), "usage")


def stream_without_usage():
    chunks = collect(complete(prompt=PROMPT, **GREEDY, stream=True))
    t.expect(all(chunk.usage is None for chunk in chunks), "a chunk carries usage")
    t.expect_equal(split_completion_stream(chunks)[0], [expected], "streamed text")


def prompt_ids():
    response = complete(prompt=PROMPT_IDS, **GREEDY)
    t.expect_equal(response.choices[0].text, expected_from_ids, "text")
    check_usage(response.usage, len(PROMPT_IDS), MAX_TOKENS)


def prompt_list():
    single = complete(prompt=OTHER_PROMPT, **GREEDY)
    both = complete(prompt=[PROMPT, OTHER_PROMPT], **GREEDY)
    t.expect_equal([(c.index, c.text) for c in both.choices], [(0, expected), (1, expected_other)], "choices")
    first = complete(prompt=PROMPT, **GREEDY)
    check_usage(both.usage, first.usage.prompt_tokens + single.usage.prompt_tokens, 2 * MAX_TOKENS)


def chat_equals_generate():
    response = chat(messages=chat_messages, **GREEDY)
    t.expect_equal(response.object, "chat.completion", "object")
    t.expect(response.id.startswith("chatcmpl-"), f"id {response.id}")
    t.expect_equal(len(response.choices), 1, "choices")
    t.expect_equal(response.choices[0].message.role, "assistant", "role")
    t.expect_equal(response.choices[0].message.content, expected_chat, "content")
    t.expect_equal(response.choices[0].finish_reason, "length", "finish_reason")
    check_usage(response.usage, None, MAX_TOKENS)


def chat_thinking_default():
    # The random model never writes </think>, so all of its text is content.
    response = chat(messages=[{"role": "system", "content": SYSTEM}, *chat_messages], **GREEDY, extra_body=IGNORE_EOS)
    t.expect_equal(response.choices[0].message.content, expected_thinking, "content")


def streamed_chat():
    plain = chat(messages=chat_messages, **GREEDY)
    chunks = collect(chat(messages=chat_messages, **GREEDY, stream=True, stream_options={"include_usage": True}))
    t.expect_equal(chunks[0].choices[0].delta.role, "assistant", "the first chunk names the role")
    contents, finish_reasons, roles, usage = split_chat_stream(chunks)
    t.expect_equal(roles, ["assistant"], "roles")
    t.expect_equal(contents, [expected_chat], "content")
    t.expect_equal(finish_reasons, ["length"], "finish reasons")
    t.expect_equal(usage_counts(usage, MAX_TOKENS), usage_counts(plain.usage, MAX_TOKENS), "usage")


def completion_stop():
    stop, before = pick_stop_string(expected)
    response = complete(prompt=PROMPT, **GREEDY, stop=[stop, "never-seen"])
    t.expect_equal(response.choices[0].text, before, "text")
    t.expect_equal(response.choices[0].finish_reason, "stop", "finish_reason")
    t.expect(response.usage.completion_tokens < MAX_TOKENS, "fewer tokens than max_tokens")
    texts, finish_reasons, _ = split_completion_stream(collect(complete(prompt=PROMPT, **GREEDY, stop=stop,
                                                                        stream=True)))
    t.expect_equal(texts, [before], "no part of the stop string is streamed")
    t.expect_equal(finish_reasons, ["stop"], "streamed finish reason")


def chat_stop():
    stop, before = pick_stop_string(expected_chat)
    response = chat(messages=chat_messages, **GREEDY, stop=stop)
    t.expect_equal(response.choices[0].message.content, before, "content")
    t.expect_equal(response.choices[0].finish_reason, "stop", "finish_reason")
    contents, finish_reasons, _, _ = split_chat_stream(collect(chat(messages=chat_messages, **GREEDY, stop=stop,
                                                                    stream=True)))
    t.expect_equal(contents, [before], "streamed content")
    t.expect_equal(finish_reasons, ["stop"], "streamed finish reason")


def n_two():
    single = complete(prompt=PROMPT, **GREEDY)
    response = complete(prompt=PROMPT, **GREEDY, n=2)
    t.expect_equal([(c.index, c.text, c.finish_reason) for c in response.choices],
                   [(0, expected, "length"), (1, expected, "length")], "choices")
    check_usage(response.usage, single.usage.prompt_tokens, 2 * MAX_TOKENS)
    texts, finish_reasons, usage = split_completion_stream(collect(complete(
        prompt=PROMPT, **GREEDY, n=2, stream=True, stream_options={"include_usage": True})))
    t.expect_equal(texts, [expected, expected], "streamed texts")
    t.expect_equal(finish_reasons, ["length", "length"], "streamed finish reasons")
    t.expect_equal(usage_counts(usage, MAX_TOKENS), usage_counts(response.usage, MAX_TOKENS), "usage")


def n_two_chat():
    response = chat(messages=chat_messages, **GREEDY, n=2)
    t.expect_equal([(c.index, c.message.content) for c in response.choices], [(0, expected_chat), (1, expected_chat)],
                   "choices")
    t.expect_equal(response.usage.completion_tokens, 2 * MAX_TOKENS, "completion_tokens")


def echo():
    response = complete(prompt=PROMPT, **GREEDY, echo=True)
    t.expect_equal(response.choices[0].text, PROMPT + expected, "text")
    check_usage(response.usage, None, MAX_TOKENS)
    texts, _, _ = split_completion_stream(collect(complete(prompt=PROMPT, **GREEDY, echo=True, stream=True)))
    t.expect_equal(texts, [PROMPT + expected], "streamed text")


def completion_logprobs():
    response = complete(prompt=PROMPT, **GREEDY, logprobs=2)
    choice = response.choices[0]
    t.expect_equal(choice.text, expected, "asking for logprobs changes no text")
    check_completion_logprobs(choice.logprobs, choice.text, response.usage.completion_tokens, 2)
    streamed = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for chunk in collect(complete(prompt=PROMPT, **GREEDY, logprobs=2, stream=True)):
        for part in chunk.choices:
            if part.logprobs is None:
                continue
            for key, values in streamed.items():
                values.extend(getattr(part.logprobs, key))
    t.expect_equal(streamed, choice.logprobs.model_dump(), "streamed logprobs equal the unstreamed ones")
    expect_api_error(lambda: complete(prompt=PROMPT, **GREEDY, logprobs=21), 400)
    # Echo with logprobs: the prompt's tokens lead (the first without a logprob), then the same
    # entries as without echo (tests/conformance/prompt_logprobs_test.py checks their values).
    echoed = complete(prompt=PROMPT, **GREEDY, logprobs=2, echo=True).choices[0]
    generated = len(choice.logprobs.tokens)
    for key in ("tokens", "token_logprobs", "top_logprobs"):
        t.expect_equal(getattr(echoed.logprobs, key)[-generated:], getattr(choice.logprobs, key),
                       f"echoed {key} end with the generated ones")
    t.expect(echoed.logprobs.token_logprobs[0] is None and echoed.logprobs.top_logprobs[0] is None,
             "the first prompt token has no logprob")
    t.expect_equal("".join(echoed.logprobs.tokens), echoed.text, "the echoed tokens spell the text")


def chat_logprobs():
    request = {"messages": chat_messages, **GREEDY, "logprobs": True, "top_logprobs": 2}
    response = chat(**request)
    choice = response.choices[0]
    t.expect_equal(choice.message.content, expected_chat, "content")
    check_chat_logprobs(choice.logprobs.content, choice.message.content, response.usage.completion_tokens, 2)
    streamed = [entry for chunk in collect(chat(**request, stream=True)) for part in chunk.choices
                for entry in (part.logprobs.content if part.logprobs and part.logprobs.content else [])]
    t.expect_equal([e.model_dump() for e in streamed], [e.model_dump() for e in choice.logprobs.content],
                   "streamed logprobs equal the unstreamed ones")
    without = chat(messages=chat_messages, **GREEDY)
    t.expect(without.choices[0].logprobs is None, "no logprobs unless asked")
    error = expect_api_error(lambda: chat(messages=chat_messages, top_logprobs=2), 400)
    t.expect_equal(error.param, "top_logprobs", "param")


def errors():
    missing = expect_api_error(lambda: complete(model="no-such-model", prompt=PROMPT, **GREEDY), 404,
                               openai.NotFoundError, code="model_not_found", param="model",
                               type="invalid_request_error")
    t.expect(missing.message, "a message")
    expect_api_error(lambda: chat(model="no-such-model", messages=chat_messages, **GREEDY, stream=True), 404,
                     code="model_not_found")
    expect_api_error(lambda: complete(prompt=PROMPT, max_tokens="many"), 400, openai.BadRequestError,
                     param="max_tokens", type="invalid_request_error")
    expect_api_error(lambda: complete(prompt=PROMPT, temperature=-1), 400, param="temperature")
    # As in vLLM, an unknown top-level field is ignored (newer SDKs send fields older servers
    # lack); one inside a known object is still a 400.
    ignored = complete(prompt=PROMPT, **GREEDY, extra_body={**IGNORE_EOS, "not_an_openai_field": 1})
    plain = complete(prompt=PROMPT, **GREEDY)
    t.expect_equal(ignored.choices[0].text, plain.choices[0].text, "text with an unknown field ignored")
    expect_api_error(lambda: complete(prompt=PROMPT, **GREEDY, stream=True, stream_options={"usage": True}),
                     400, param="stream_options.usage")
    expect_api_error(lambda: complete(prompt=PROMPT, max_tokens=1 << 20), 400, param="max_tokens",
                     code="context_length_exceeded")
    expect_api_error(lambda: chat(messages=[]), 400, type="invalid_request_error")


def sigterm_mid_stream():
    stream = complete(prompt=PROMPT, max_tokens=20000, temperature=0, stream=True)
    iterator = iter(stream)
    next(iterator)
    exit_code = target.stop()
    t.expect_equal(exit_code, 0, "exit code after SIGTERM")
    # The client sees either the end of the stream or a connection error, never a hang: the
    # client's 60 s timeout and the script deadline bound this.
    start = time.monotonic()
    try:
        for _ in iterator:
            pass
    except (openai.OpenAIError, OSError):
        pass
    t.expect(time.monotonic() - start < 15, "the interrupted stream ended within 15 s")


failed = t.run_checks([
    ("GET /v1/models lists the served model", models_list),
    ("completion equals pdserve-generate", completion_equals_generate),
    ("streamed completion equals pdserve-generate, usage matches the unstreamed one", streamed_completion),
    ("stream without include_usage sends no usage", stream_without_usage),
    ("prompt as token ids: usage counts them, text equals pdserve-generate --prompt-ids", prompt_ids),
    ("a list of prompts gets one choice each, in order", prompt_list),
    ("chat equals pdserve-generate --chat", chat_equals_generate),
    ("chat with a system message, thinking on by default: equals --enable-thinking", chat_thinking_default),
    ("streamed chat: role first, content equals pdserve-generate --chat, usage", streamed_chat),
    ("completion stop string: cut before it, finish_reason stop", completion_stop),
    ("chat stop string: cut before it, finish_reason stop", chat_stop),
    ("n=2 (greedy): two identical choices, usage counts the prompt once", n_two),
    ("n=2 chat (greedy): two identical choices", n_two_chat),
    ("echo: the prompt comes first, streaming or not", echo),
    ("completion logprobs: one entry per token, the tokens spell the text, greedy picks the top",
     completion_logprobs),
    ("chat logprobs: bytes spell the content, top_logprobs sorted, greedy picks the top", chat_logprobs),
    ("errors surface as openai.APIStatusError with the server's status and body", errors),
    ("SIGTERM with a stream in flight: the stream ends and the server exits 0", sigterm_mid_stream),
])
t.finish(failed, target, f"openai client checks against {TARGET}")

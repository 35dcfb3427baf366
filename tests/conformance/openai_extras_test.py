"""The vLLM/OpenAI request surface beyond the core (issue #17 items 3 and 4), with the official
`openai` client against a colocated pdserve-decode or a 1P1D cluster behind pdserve-proxy
(argument: colocated | 1p1d). Each check has an oracle that must hold whatever the random
weights say:
  * logit_bias: +100 on one token makes greedy output that token, also for the first token,
    which the prefill node samples in the 1P1D cluster; -100 on the greedy token changes it;
  * seeds: choice i of a seeded n > 1 request equals an n = 1 request with seed + i;
  * continuous_usage_stats: every chunk carries usage, growing to the final one;
  * chat echo / continue_final_message / add_generation_prompt / developer: the answers and
    the prompts (/tokenize's chat form) equal what the completions API gives on the same tokens;
  * known OpenAI fields and unknown ones are accepted (one log line for the unknown ones);
  * /tokenize, /detokenize, /version, /v1/models/{id}, /ready and /health?ready=1;
  * colocated only: a hub id in a Hugging Face cache is served under that id, and a proxy's
    readiness follows its nodes.
"""
import json
import os
import re
import shutil
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "python"))
import openai  # noqa: E402
import pdserve_testing as t  # noqa: E402

t.set_deadline(220)
TARGET = sys.argv[1] if len(sys.argv) > 1 else "colocated"
PROMPT = "The quick brown fox jumps"
NO_THINKING = {"chat_template_kwargs": {"enable_thinking": False}}
GREEDY = {"temperature": 0, "extra_body": {"ignore_eos": True}}

model_dir = t.make_model()
target = t.start_target(TARGET, model_dir)
client = openai.OpenAI(base_url=target.url + "/v1", api_key="x", max_retries=0, timeout=60)
model = target.name


def post(path, body):
    status, text = t.http("POST", target.url + path, body)
    t.expect_equal(status, 200, f"POST {path} {body}: {text[:300]}")
    return json.loads(text)


def tokenize(text):
    return post("/tokenize", {"prompt": text})["tokens"]


def detokenize(ids):
    return post("/detokenize", {"tokens": ids})["prompt"]


def complete(**kwargs):
    return client.completions.create(model=model, prompt=PROMPT, **kwargs)


VLLM_CHAT_FIELDS = ("add_generation_prompt", "continue_final_message", "echo")


def chat(messages, **kwargs):
    """The vLLM fields, which the client does not know, go in extra_body."""
    extra = {"ignore_eos": True, **NO_THINKING, **kwargs.pop("extra_body", {}),
             **{key: kwargs.pop(key) for key in VLLM_CHAT_FIELDS if key in kwargs}}
    return client.chat.completions.create(model=model, messages=messages, extra_body=extra, **kwargs)


def streamed_text(stream):
    text = ""
    for chunk in stream:
        for choice in chunk.choices:
            text += choice.text
    return text


def a_single_token_word():
    """A word that is one token on its own and that greedy decoding does not pick anyway."""
    greedy = complete(max_tokens=4, **GREEDY).choices[0].text
    for word in (" banana", " river", " seven", " blue"):
        ids = tokenize(word)
        if len(ids) == 1 and word not in greedy:
            return ids[0], word
    raise AssertionError("no single-token word found")


def logit_bias_forces_and_bans():
    token, word = a_single_token_word()
    bias = {str(token): 100}
    forced = complete(max_tokens=4, logit_bias=bias, **GREEDY)
    t.expect_equal(forced.choices[0].text, word * 4, "+100 makes greedy pick the token, the first one too")
    t.expect_equal(streamed_text(complete(max_tokens=4, logit_bias=bias, stream=True, **GREEDY)), word * 4,
                   "streamed")
    content = chat([{"role": "user", "content": "Hi"}], max_tokens=3, temperature=0, logit_bias=bias)
    t.expect_equal(content.choices[0].message.content, word * 3, "chat with +100")
    greedy = complete(max_tokens=1, **GREEDY).choices[0].text
    first = tokenize(greedy)
    t.expect_equal(len(first), 1, f"the greedy token {greedy!r} tokenizes alone")
    banned = complete(max_tokens=1, logit_bias={str(first[0]): -100}, **GREEDY).choices[0].text
    t.expect(tokenize(banned) != first, f"-100 on the greedy token {greedy!r} changes it (got {banned!r})")
    unchanged = complete(max_tokens=4, logit_bias={}, **GREEDY).choices[0].text
    t.expect(unchanged.startswith(greedy), "an empty logit_bias changes nothing")
    for bad in ({"-1": 5}, {"151936": 5}, {str(token): 101}, {"x": 1}):
        try:
            complete(max_tokens=1, logit_bias=bad)
            raise AssertionError(f"logit_bias {bad} was accepted")
        except openai.BadRequestError:
            pass


def seeded_choices():
    sampled = {"temperature": 1.0, "max_tokens": 8, "extra_body": {"ignore_eos": True}}
    together = complete(n=3, seed=1234, **sampled)
    texts = [choice.text for choice in sorted(together.choices, key=lambda c: c.index)]
    alone = [complete(seed=1234 + i, **sampled).choices[0].text for i in range(3)]
    t.expect_equal(texts, alone, "choice i equals an n=1 request with seed + i")
    t.expect(len(set(texts)) > 1, f"the seeded choices differ: {texts}")
    streamed = {}
    for chunk in complete(n=3, seed=1234, stream=True, **sampled):
        for choice in chunk.choices:
            streamed[choice.index] = streamed.get(choice.index, "") + choice.text
    t.expect_equal([streamed[i] for i in range(3)], alone, "streamed choices too")
    chats = chat([{"role": "user", "content": "Hi"}], n=2, seed=99, temperature=1.0, max_tokens=6)
    single = chat([{"role": "user", "content": "Hi"}], seed=100, temperature=1.0, max_tokens=6)
    t.expect_equal(sorted(chats.choices, key=lambda c: c.index)[1].message.content, single.choices[0].message.content,
                   "chat choice 1 equals seed + 1")


def continuous_usage():
    chunks = list(complete(max_tokens=5, stream=True, stream_options={"include_usage": True,
                                                                         "continuous_usage_stats": True}, **GREEDY))
    t.expect(all(chunk.usage is not None for chunk in chunks), "every chunk carries usage")
    counts = [chunk.usage.completion_tokens for chunk in chunks]
    t.expect_equal(counts, sorted(counts), "completion_tokens never decrease")
    t.expect_equal(chunks[-1].choices, [], "the usage chunk comes last")
    t.expect_equal(counts[-1], 5, "the final usage")
    for chunk in chunks:
        t.expect_equal(chunk.usage.total_tokens, chunk.usage.prompt_tokens + chunk.usage.completion_tokens, "total")
    chat_chunks = list(chat([{"role": "user", "content": "Hi"}], max_tokens=3, temperature=0, stream=True,
                            stream_options={"include_usage": True, "continuous_usage_stats": True}))
    t.expect(all(chunk.usage is not None for chunk in chat_chunks), "every chat chunk carries usage")
    t.expect_equal(chat_chunks[-1].usage.completion_tokens, 3, "the final chat usage")


CONVERSATION = [{"role": "user", "content": "Tell me a story."}, {"role": "assistant", "content": "Once upon a"}]


def chat_tokens(messages, **fields):
    return post("/tokenize", {"messages": messages, **NO_THINKING, **fields})["tokens"]


def continue_final_message():
    whole = chat_tokens(CONVERSATION, add_generation_prompt=False)
    continued = chat_tokens(CONVERSATION, add_generation_prompt=False, continue_final_message=True)
    t.expect_equal(whole[:len(continued)], continued, "the continued prompt is a prefix of the whole one")
    t.expect_equal(detokenize(whole[len(continued):]), "<|im_end|>\n", "only the end of the turn is cut")
    opened = chat_tokens(CONVERSATION[:1])
    t.expect_equal(opened[:len(chat_tokens(CONVERSATION[:1], add_generation_prompt=False))],
                   chat_tokens(CONVERSATION[:1], add_generation_prompt=False),
                   "add_generation_prompt appends the assistant's opening")
    t.expect(detokenize(opened).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n"), "the opening")
    response = chat(CONVERSATION, max_tokens=6, temperature=0, add_generation_prompt=False,
                    continue_final_message=True)
    plain = client.completions.create(model=model, prompt=continued, max_tokens=6, **GREEDY)
    t.expect_equal(response.choices[0].message.content, plain.choices[0].text,
                   "the continuation equals a completion of the same tokens")
    t.expect_equal(response.usage.prompt_tokens, len(continued), "prompt_tokens")
    echoed = chat(CONVERSATION, max_tokens=6, temperature=0, add_generation_prompt=False,
                  continue_final_message=True, echo=True)
    t.expect_equal(echoed.choices[0].message.content, "Once upon a" + plain.choices[0].text,
                   "echo puts the final message first")
    streamed = ""
    for chunk in chat(CONVERSATION, max_tokens=6, temperature=0, add_generation_prompt=False,
                      continue_final_message=True, echo=True, stream=True):
        for choice in chunk.choices:
            streamed += choice.delta.content or ""
    t.expect_equal(streamed, echoed.choices[0].message.content, "streamed echo")
    try:
        chat(CONVERSATION, max_tokens=2, continue_final_message=True)
        raise AssertionError("continue_final_message with add_generation_prompt was accepted")
    except openai.BadRequestError as error:
        t.expect_equal(error.param, "continue_final_message", "param")


def developer_role():
    developer = [{"role": "developer", "content": "Be terse."}, {"role": "user", "content": "Hi"}]
    system = [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Hi"}]
    t.expect_equal(chat_tokens(developer), chat_tokens(system), "developer renders as system")
    t.expect_equal(chat(developer, max_tokens=4, temperature=0).choices[0].message.content,
                   chat(system, max_tokens=4, temperature=0).choices[0].message.content, "same answer")


def accepted_fields():
    messages = [{"role": "user", "content": "Hi"}]
    plain = chat(messages, max_tokens=4, temperature=0).choices[0].message.content
    known = chat(messages, max_tokens=4, temperature=0, store=True, metadata={"k": "v"}, reasoning_effort="low",
                 service_tier="auto", parallel_tool_calls=True, user="someone",
                 extra_body={"priority": 0}).choices[0].message.content
    t.expect_equal(known, plain, "OpenAI's known fields change nothing")
    unknown = chat(messages, max_tokens=4, temperature=0,
                   extra_body={"zz_unknown_a": 1, "zz_unknown_b": [2]}).choices[0].message.content
    t.expect_equal(unknown, plain, "unknown fields are ignored")
    t.wait_until(lambda: "zz_unknown_a, zz_unknown_b" in target.decode.log(), 5, "the log line")
    lines = [line for line in target.decode.log().splitlines() if "ignored request fields" in line]
    t.expect_equal(sum("zz_unknown_a, zz_unknown_b" in line for line in lines), 1, "one log line per request")
    t.expect(not any("store" in line or "metadata" in line for line in lines), "known fields are not logged")
    try:
        chat([{"role": "user", "content": "Hi", "contnet": "x"}], max_tokens=1)
        raise AssertionError("an unknown field inside a message was accepted")
    except openai.BadRequestError as error:
        t.expect_equal(error.param, "messages[0].contnet", "param")


def endpoints():
    ids = tokenize("Hello world")
    t.expect_equal(detokenize(ids), "Hello world", "detokenize(tokenize(s)) == s")
    shaped = post("/tokenize", {"model": model, "prompt": "Hello world", "add_special_tokens": True,
                                "return_token_strs": True})
    t.expect_equal(shaped["count"], len(ids), "count")
    t.expect_equal(shaped["token_strs"], ["Hello", "\u0120world"], "token_strs")
    t.expect(shaped["max_model_len"] > 0, "max_model_len")
    version = t.get_json(target.url + "/version")
    t.expect(isinstance(version.get("version"), str) and version["version"], f"version {version}")
    card = client.models.retrieve(model)
    t.expect_equal((card.id, card.object), (model, "model"), "GET /v1/models/{id}")
    try:
        client.models.retrieve("no-such/model")
        raise AssertionError("an unknown model was found")
    except openai.NotFoundError:
        pass
    t.expect_equal(t.http("GET", target.url + "/ready"), (200, '{"ready":true}'), "/ready")
    t.expect_equal(t.http("GET", target.url + "/health?ready=1"), (200, '{"ready":true}'), "/health?ready=1")
    t.expect_equal(t.http("GET", target.url + "/health"), (200, "{}"), "/health")
    # The node answers (and registers) only after its warm-up request: a prefill and a decode step.
    log = target.decode.log()
    warmed = re.search(r"warm-up: 2 tokens in \d+ ms; ready", log)
    serving = log.find("pdserve-decode: serving")
    t.expect(warmed is not None and 0 <= warmed.start() < serving,
             f"the warm-up line comes before the serving line:\n{log[:2000]}")


def hub_id_is_the_served_name():
    """A model found in a Hugging Face cache by its hub id is served under that id."""
    cache = os.path.join(t.work_dir(), "hf-hub")
    repo = os.path.join(cache, "models--TinyOrg--Tiny-Qwen3")
    os.makedirs(os.path.join(repo, "refs"))
    shutil.copytree(model_dir, os.path.join(repo, "snapshots", "0123abcd"))
    with open(os.path.join(repo, "refs", "main"), "w") as ref:
        ref.write("0123abcd")
    os.environ["HF_HUB_CACHE"] = cache
    try:
        node = t.start_colocated("TinyOrg/Tiny-Qwen3", name="hub-node")
        named = t.start_colocated("TinyOrg/Tiny-Qwen3", ["--served-model-name", "mine"], name="named-node")
    finally:
        del os.environ["HF_HUB_CACHE"]
    try:
        hub_client = openai.OpenAI(base_url=node.url + "/v1", api_key="x", max_retries=0, timeout=60)
        t.expect_equal([m.id for m in hub_client.models.list().data], ["TinyOrg/Tiny-Qwen3"], "served name")
        t.expect_equal(hub_client.models.retrieve("TinyOrg/Tiny-Qwen3").id, "TinyOrg/Tiny-Qwen3", "retrieve")
        answer = hub_client.completions.create(model="TinyOrg/Tiny-Qwen3", prompt=PROMPT, max_tokens=2)
        t.expect_equal(answer.model, "TinyOrg/Tiny-Qwen3", "the answer's model")
        t.expect_equal(named.name, "mine", "--served-model-name overrides")
    finally:
        node.stop()
        named.stop()


def proxy_readiness():
    """A proxy is alive at once and ready only with a decode node up (and a prefill node with
    --ready-needs-prefill)."""
    token = {"PDSERVE_CLUSTER_TOKEN": t.CLUSTER_TOKEN}
    bare = t.Process("bare-proxy", [t.BINARIES["proxy"], "--port", "0"], r"listening on (http://\S+)", env=token)
    static = t.Process("static-proxy", [t.BINARIES["proxy"], "--port", "0", "--decode", target.url],
                       r"listening on (http://\S+)", env=token)
    strict = t.Process("strict-proxy", [t.BINARIES["proxy"], "--port", "0", "--decode", target.url,
                                        "--ready-needs-prefill"], r"listening on (http://\S+)", env=token)
    try:
        bare_url, static_url, strict_url = (p.match.group(1) for p in (bare, static, strict))
        t.expect_equal(t.http("GET", bare_url + "/health")[0], 200, "alive without nodes")
        for path in ("/ready", "/health?ready=1", "/health?x=2&ready=true"):
            status, body = t.http("GET", bare_url + path)
            t.expect_equal(status, 503, f"{path} without nodes")
            t.expect("no decode node" in json.loads(body)["error"]["message"], body)
        t.expect_equal(t.http("GET", static_url + "/ready")[0], 200, "ready with a decode node")
        status, body = t.http("GET", strict_url + "/ready")
        t.expect_equal(status, 503, "--ready-needs-prefill without a prefill node")
        t.expect("no prefill node" in body, body)
        via = t.http("POST", static_url + "/tokenize", {"prompt": "Hello world"})
        t.expect_equal(via, (200, json.dumps({"count": 2, "max_model_len": json.loads(via[1])["max_model_len"],
                                              "tokens": tokenize("Hello world"), "token_strs": None},
                                             separators=(",", ":"))), "/tokenize through a proxy")
    finally:
        for process in (bare, static, strict):
            process.stop()


checks = [
    ("logit_bias: +100 forces a token (the first too), -100 bans the greedy one", logit_bias_forces_and_bans),
    ("n > 1 with a seed: choice i equals an n=1 request with seed + i", seeded_choices),
    ("stream_options.continuous_usage_stats: usage on every chunk", continuous_usage),
    ("continue_final_message / add_generation_prompt / chat echo against completions of the same tokens",
     continue_final_message),
    ("the developer role is the system role", developer_role),
    ("known OpenAI fields accepted, unknown ones ignored with one log line, misspelled message fields refused",
     accepted_fields),
    ("/tokenize, /detokenize, /version, /v1/models/{id}, /ready", endpoints),
]
if TARGET == "colocated":
    checks += [
        ("a hub id from the HF cache is the served name; --served-model-name overrides", hub_id_is_the_served_name),
        ("proxy readiness follows its nodes", proxy_readiness),
    ]
failed = t.run_checks(checks)
t.finish(failed, target, f"openai extras checks against {TARGET}")

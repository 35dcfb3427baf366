"""Prompt logprobs (issue #33 item 1) against a colocated pdserve-decode or a 1P1D cluster
behind pdserve-proxy (argument: colocated | 1p1d), read by the official `openai` client and
compared with the float64 reference (tests/reference/prompt_logprobs.py, Debian's torch):
  * completions `echo: true, logprobs: N` (what lm-eval's loglikelihood sends, max_tokens 1):
    the prompt's tokens lead the logprobs, the first with null logprob and top_logprobs, the
    others the reference's logprob and top N; whole and streamed alike;
  * vLLM's `prompt_logprobs: N` on completions and chat: [null, {id: {logprob, rank,
    decoded_token}}] with the prompt token and the reference's top N;
  * the same request again (its prompt's blocks now cached: prompt logprobs bypass the cache)
    answers the same;
  * out-of-range counts and prompt_logprobs with stream are 400s.
The nodes run the CPU backend's float32 path (PDSERVE_CPU_ISA avx2 where the CPU has it; the
bf16 level rounds linear inputs): |ours - ref| <= 1e-4 + 1e-5 |ref| per logprob.
"""
import json
import math
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "python"))
import openai  # noqa: E402
import pdserve_testing as t  # noqa: E402

t.set_deadline(220)
TARGET = sys.argv[1] if len(sys.argv) > 1 else "colocated"
ABS_TOL, REL_TOL = 1e-4, 1e-5


def float32_cpu_path():
    with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
        return "avx2" if " avx2" in cpuinfo.read() else "portable"


os.environ["PDSERVE_CPU_ISA"] = float32_cpu_path()
model_dir = t.make_model()
target = t.start_target(TARGET, model_dir)
client = openai.OpenAI(base_url=target.url + "/v1", api_key="x", max_retries=0, timeout=60)
model = target.name


def reference(prompts, top):
    """The float64 reference's prompt logprobs of each token list (one oracle process)."""
    script = os.path.join(t.SOURCE, "tests/reference/prompt_logprobs.py")
    stdin = "".join(json.dumps(p) + "\n" for p in prompts)
    out = subprocess.run(["/usr/bin/python3", script, "--model", model_dir, "--top", str(top)],
                         input=stdin, capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        raise AssertionError(f"the reference failed: {out.stderr}")
    return [json.loads(line) for line in out.stdout.splitlines()]


def close(ours, ref):
    return ours is not None and abs(ours - ref) <= ABS_TOL + REL_TOL * abs(ref)


def tokenize(text):
    status, body = t.http("POST", target.url + "/tokenize", {"prompt": text})
    t.expect_equal(status, 200, f"/tokenize: {body[:200]}")
    return json.loads(body)["tokens"]


def token_text(token_id):
    status, body = t.http("POST", target.url + "/detokenize", {"tokens": [token_id]})
    t.expect_equal(status, 200, f"/detokenize: {body[:200]}")
    return json.loads(body)["prompt"]


TEXT = "The quick brown fox jumps over the lazy dog, and then"
TEXT_IDS = tokenize(TEXT)
IDS = [9707, 1879, 11, 279, 2086, 374, 220, 17, 15, 17, 21, 13, 151644, 77091, 198]
CHAT = [{"role": "user", "content": "Name three colours."}]
CHAT_IDS = json.loads(t.http("POST", target.url + "/tokenize",
                             {"messages": CHAT, "add_generation_prompt": True})[1])["tokens"]
REF = dict(zip(("text", "ids", "chat"), reference([TEXT_IDS, IDS, CHAT_IDS], top=3)))


def check_echo(choice, prompt_ids, ref, top, what):
    """An echo-with-logprobs choice: the prompt's entries, then one per generated token."""
    logprobs = choice.logprobs
    count = len(prompt_ids)
    t.expect(len(logprobs.tokens) == count + 1, f"{what}: {len(logprobs.tokens)} entries for a "
             f"{count}-token prompt and 1 generated token")
    t.expect(logprobs.token_logprobs[0] is None and logprobs.top_logprobs[0] is None,
             f"{what}: the first prompt token has a logprob: {logprobs.token_logprobs[0]}")
    t.expect_equal(logprobs.text_offset[0], 0, f"{what}: the first text_offset")
    for p in range(1, count):
        ours, expected = logprobs.token_logprobs[p], ref["logprobs"][p - 1]
        t.expect(close(ours, expected), f"{what}: position {p}: {ours} vs the reference's {expected}")
        alternatives = sorted(logprobs.top_logprobs[p].values(), reverse=True)
        reference_top = [lp for _, lp in ref["top"][p - 1][:top]]
        t.expect(len(alternatives) == top and all(map(close, alternatives, reference_top)),
                 f"{what}: position {p}: top {alternatives} vs {reference_top}")
    generated = logprobs.token_logprobs[count]
    t.expect(generated is not None and generated <= 0, f"{what}: the generated token's logprob {generated}")


def check_vllm_prompt_logprobs(entries, prompt_ids, ref, top, what):
    t.expect(entries is not None and len(entries) == len(prompt_ids),
             f"{what}: {None if entries is None else len(entries)} entries for {len(prompt_ids)} tokens")
    t.expect(entries[0] is None, f"{what}: the first entry is {entries[0]}")
    for p in range(1, len(prompt_ids)):
        entry = entries[p]
        own = entry.get(str(prompt_ids[p]))
        t.expect(own is not None and close(own["logprob"], ref["logprobs"][p - 1]),
                 f"{what}: position {p}: {own} vs the reference's {ref['logprobs'][p - 1]}")
        higher = sum(lp > ref["logprobs"][p - 1] + ABS_TOL for _, lp in ref["top"][p - 1])
        t.expect(own["rank"] >= higher + 1, f"{what}: position {p}: rank {own['rank']}")
        for rank, (token, logprob) in enumerate(ref["top"][p - 1][:top], start=1):
            got = entry.get(str(token))
            t.expect(got is not None and close(got["logprob"], logprob)
                     and (token == prompt_ids[p] or got["rank"] == rank),
                     f"{what}: position {p}: the reference's #{rank} {token} ({logprob}) is {got}")
        t.expect(len(entry) <= top + 1, f"{what}: position {p}: {len(entry)} entries")


def echo_completion(prompt, top, **kwargs):
    return client.completions.create(model=model, prompt=prompt, echo=True, logprobs=top, max_tokens=1,
                                     temperature=0, seed=1234, **kwargs)


def check_lm_eval_request():
    """lm-eval's loglikelihood request, token ids and text, twice (the second with its blocks cached)."""
    answers = []
    for attempt in range(2):
        by_ids = echo_completion(IDS, 1)
        check_echo(by_ids.choices[0], IDS, REF["ids"], 1, f"token-id prompt, attempt {attempt}")
        answers.append(by_ids.choices[0].logprobs.token_logprobs)
    t.expect_equal(answers[1], answers[0], "the same prompt again (cached blocks)")
    by_text = echo_completion(TEXT, 2)
    check_echo(by_text.choices[0], TEXT_IDS, REF["text"], 2, "text prompt")
    t.expect(by_text.choices[0].text.startswith(TEXT), "the text starts with the echoed prompt")
    t.expect_equal(by_text.usage.prompt_tokens, len(TEXT_IDS), "prompt_tokens")


def check_streamed_echo():
    whole = echo_completion(TEXT, 2).choices[0]
    text, tokens, token_logprobs = "", [], []
    for chunk in echo_completion(TEXT, 2, stream=True):
        for choice in chunk.choices:
            text += choice.text
            if choice.logprobs:
                tokens += choice.logprobs.tokens
                token_logprobs += choice.logprobs.token_logprobs
    t.expect_equal(text, whole.text, "the streamed text")
    t.expect_equal(tokens, whole.logprobs.tokens, "the streamed logprob tokens")
    t.expect_equal(token_logprobs, whole.logprobs.token_logprobs, "the streamed token_logprobs")


def check_vllm_field():
    completion = client.completions.create(model=model, prompt=IDS, max_tokens=2, temperature=0,
                                           extra_body={"prompt_logprobs": 3})
    choice = completion.model_dump()["choices"][0]
    check_vllm_prompt_logprobs(choice.get("prompt_logprobs"), IDS, REF["ids"], 3, "completions")
    t.expect(choice["logprobs"] is None, "prompt_logprobs alone asks for no sampled-token logprobs")
    text = choice["prompt_logprobs"][1][str(IDS[1])]["decoded_token"]
    t.expect_equal(text, token_text(IDS[1]), "decoded_token")
    chat = client.chat.completions.create(model=model, messages=CHAT, max_tokens=2, temperature=0,
                                          extra_body={"prompt_logprobs": 1})
    check_vllm_prompt_logprobs(chat.model_dump().get("prompt_logprobs"), CHAT_IDS, REF["chat"], 1, "chat")
    plain = client.completions.create(model=model, prompt=IDS, max_tokens=2, temperature=0)
    t.expect("prompt_logprobs" not in plain.model_dump()["choices"][0]
             or plain.model_dump()["choices"][0]["prompt_logprobs"] is None,
             "no prompt_logprobs unless asked")


def check_refusals():
    for body, param in (({"prompt_logprobs": 21}, "prompt_logprobs"),
                        ({"prompt_logprobs": -1}, "prompt_logprobs"),
                        ({"prompt_logprobs": 1, "stream": True}, "prompt_logprobs")):
        status, text = t.http("POST", target.url + "/v1/completions",
                              {"model": model, "prompt": "Hi there", "max_tokens": 1, **body})
        t.expect_equal(status, 400, f"{body}: {text[:200]}")
        t.expect_equal(json.loads(text)["error"]["param"], param, f"{body}: the error's param")


failed = t.run_checks([(check.__name__, check) for check in (check_lm_eval_request, check_streamed_echo, check_vllm_field, check_refusals)])
t.finish(failed, target)

"""The real lm-eval harness (issue #33 item 2) against a colocated pdserve-decode or a 1P1D
cluster behind pdserve-proxy (argument: colocated | 1p1d), as users point it at vLLM:
  * `local-completions` (Hugging Face tokenizer from the model folder) runs the loglikelihood
    task tasks/pdserve_choice.yaml (echo + logprobs, max_tokens 1: every choice of every doc)
    and the generate-until task tasks/pdserve_generate.yaml;
  * `local-chat-completions` (chat template applied) runs the generate-until task.
Oracles: each loglikelihood lm-eval logged equals the float64 reference's sum of the
continuation's prompt logprobs on the very token ids lm-eval sent (its own _encode_pair),
within 1e-4 per continuation token + 1e-5 of the sum (the nodes run the CPU's float32 path);
is_greedy equals the reference's wherever its top-2 margin exceeds 1e-3; each generated text
equals what a plain HTTP request with the same prompt, greedy settings and stop gives.
Runs in lm-eval's own venv (scripts/setup.sh: .venv-lmeval); the tasks' data are local files.
"""
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "python"))
import pdserve_testing as t  # noqa: E402

t.set_deadline(420)
TARGET = sys.argv[1] if len(sys.argv) > 1 else "colocated"
TASKS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tasks")
ABS_TOL_PER_TOKEN, REL_TOL = 1e-4, 1e-5
GREEDY_MARGIN = 1e-3

# Offline: the datasets come from local files, the tokenizer from the model folder.
cache = os.path.join(t.work_dir(), "hf-cache")
os.environ.update({"HF_HOME": cache, "HF_DATASETS_CACHE": cache, "HF_HUB_OFFLINE": "1",
                   "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
    os.environ["PDSERVE_CPU_ISA"] = "avx2" if " avx2" in cpuinfo.read() else "portable"

import lm_eval  # noqa: E402
from lm_eval.api.registry import get_model  # noqa: E402
from lm_eval.tasks import TaskManager  # noqa: E402

model_dir = t.make_model()
target = t.start_target(TARGET, model_dir)


def reference(prompts):
    """Per prompt: the float64 reference's logprobs of tokens 1.. and their top 2."""
    script = os.path.join(t.SOURCE, "tests/reference/prompt_logprobs.py")
    out = subprocess.run(["/usr/bin/python3", script, "--model", model_dir, "--top", "2"],
                         input="".join(json.dumps(p) + "\n" for p in prompts),
                         capture_output=True, text=True, timeout=180)
    if out.returncode != 0:
        raise AssertionError(f"the reference failed: {out.stderr}")
    return [json.loads(line) for line in out.stdout.splitlines()]


def evaluate(model_name, tasks, **model_args):
    lm = get_model(model_name)(model=target.name, num_concurrent=1, max_retries=1, timeout=120, **model_args)
    cwd = os.getcwd()
    os.chdir(TASKS)  # the tasks' data_files are relative
    try:
        results = lm_eval.simple_evaluate(model=lm, tasks=tasks, task_manager=TaskManager(include_path=TASKS),
                                          log_samples=True, apply_chat_template="chat" in model_name)
    finally:
        os.chdir(cwd)
    return lm, results["samples"]


def post(path, body):
    status, text = t.http("POST", target.url + path, body)
    t.expect_equal(status, 200, f"POST {path}: {text[:300]}")
    return json.loads(text)


COMPLETIONS = {}


def run_completions():
    if not COMPLETIONS:
        lm, samples = evaluate("local-completions", ["pdserve_choice", "pdserve_generate"],
                               base_url=target.url + "/v1/completions", tokenizer_backend="huggingface",
                               tokenizer=model_dir)
        COMPLETIONS.update(lm=lm, samples=samples)
    return COMPLETIONS["lm"], COMPLETIONS["samples"]


def check_loglikelihoods():
    lm, samples = run_completions()
    requests = []  # (context ids, continuation ids, lm-eval's (loglikelihood, is_greedy))
    for sample in samples["pdserve_choice"]:
        for (context, continuation), response in zip(sample["arguments"], sample["resps"]):
            context_ids, continuation_ids = lm._encode_pair(context, continuation)
            requests.append((context_ids, continuation_ids, response[0]))
    t.expect(len(requests) == 11, f"{len(requests)} loglikelihood requests for 11 choices")
    oracle = reference([c + k for c, k, _ in requests])
    worst = 0.0
    for (context_ids, continuation_ids, (loglikelihood, is_greedy)), ref in zip(requests, oracle):
        positions = range(len(context_ids) - 1, len(context_ids) + len(continuation_ids) - 1)
        expected = sum(ref["logprobs"][p] for p in positions)
        bound = ABS_TOL_PER_TOKEN * len(continuation_ids) + REL_TOL * abs(expected)
        worst = max(worst, abs(loglikelihood - expected))
        t.expect(abs(loglikelihood - expected) <= bound,
                 f"{continuation_ids} after {len(context_ids)} tokens: lm-eval read {loglikelihood}, "
                 f"the reference says {expected}")
        tops = [ref["top"][p] for p in positions]
        if all(top[0][1] - top[1][1] > GREEDY_MARGIN for top in tops):
            greedy = all(top[0][0] == token for top, token in zip(tops, continuation_ids))
            t.expect_equal(is_greedy, greedy, f"is_greedy of {continuation_ids}")
    print(f"largest |lm-eval - reference| loglikelihood: {worst:.3g}")


def expected_text(text):
    for stop in ("\n\n",):
        text = text.split(stop)[0]
    return text


def check_generations(samples, plain_request):
    for sample in samples:
        generated = sample["resps"][0][0]
        expected = expected_text(plain_request(sample["arguments"][0][0]))
        t.expect_equal(generated, expected, f"the generation for {sample['doc']}")


def check_completions_generate_until():
    _, samples = run_completions()
    t.expect(len(samples["pdserve_generate"]) == 3, "three generate-until docs")
    check_generations(samples["pdserve_generate"], lambda prompt: post("/v1/completions", {
        "model": target.name, "prompt": prompt, "max_tokens": 8, "temperature": 0,
        "stop": ["\n\n"]})["choices"][0]["text"])


def check_chat_generate_until():
    _, samples = evaluate("local-chat-completions", ["pdserve_generate"],
                          base_url=target.url + "/v1/chat/completions")
    t.expect(len(samples["pdserve_generate"]) == 3, "three generate-until docs")

    def plain(chat):
        messages = json.loads(chat.prompt)  # lm-eval's JsonChatStr: the chat history as JSON text
        return post("/v1/chat/completions", {"model": target.name, "messages": messages, "max_tokens": 8,
                                             "temperature": 0, "stop": ["\n\n"]})["choices"][0]["message"]["content"]

    check_generations(samples["pdserve_generate"], plain)


failed = t.run_checks([(check.__name__, check) for check in (check_loglikelihoods, check_completions_generate_until, check_chat_generate_until)])
t.finish(failed, target)

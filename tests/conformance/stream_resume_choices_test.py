"""Stream resumption with several choices (issue #15 item 10), on a colocated pdserve-decode:
what the proxy does when a decode node fails mid-stream, replayed after every event.

A stream with X-Pdserve-Resumable carries a checkpoint comment before each event: the event's
choice, that choice's new tokens and its sampler state. For a chat stream with n = 3 and a
completion stream of two prompts with n = 2 (seeded, sampled at temperature 1), each cut point
is resumed with what a client had at that point (per choice: its tokens, sampler state and
whether its finish chunk arrived), and the resumed stream must give each choice exactly the
events the uninterrupted stream gave it after the cut: no token missing or repeated, the same
text and logprobs. Choices may interleave differently (they join the batch at other steps), so
events are compared per choice; the usage chunk and [DONE] must match too. Malformed resumes get
a 400 that names the field.
"""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "python"))
import pdserve_testing as t  # noqa: E402

t.set_deadline(220)
model_dir = t.make_model()
target = t.start_target("colocated", model_dir)
RESUMABLE = dict(t.cluster_headers(), **{"X-Pdserve-Resumable": "1"})
CHECKPOINT = ": pdserve_resume "
MAX_RESUMES = 30  # cut points per request, spread over the stream


def split_stream(text):
    """[(kind, payload)]: ("checkpoint", dict) or ("data", raw event text)."""
    out = []
    for raw in text.split("\n\n"):
        if raw.startswith(CHECKPOINT):
            out.append(("checkpoint", json.loads(raw[len(CHECKPOINT):])))
        elif raw.startswith("data: "):
            out.append(("data", raw))
    return out


def choice_of(raw):
    """The choice index of a data event, or None (usage chunk, [DONE])."""
    if raw == "data: [DONE]":
        return None
    choices = json.loads(raw[len("data: "):]).get("choices") or []
    return choices[0]["index"] if len(choices) == 1 else None


def per_choice(events):
    grouped = {}
    for raw in events:
        grouped.setdefault(choice_of(raw), []).append(raw)
    return grouped


def check_resumes(path, body, num_choices, head_events, cuts_before_a_finish_chunk):
    """`head_events`: the role chunks a chat stream starts with, one per choice, written
    together before any token; the cuts come after them (a resumed stream sends none).
    `cuts_before_a_finish_chunk`: whether the stream has cuts where a choice has all its tokens
    but not its finish chunk (a chat stream with logprobs: the last token's event comes first);
    all of those are tried."""
    url = target.url + path
    status, text = t.http("POST", url, body, headers=RESUMABLE)
    t.expect_equal(status, 200, f"resumable stream: {text[:300]}")
    items = split_stream(text)
    head = next(payload for kind, payload in items if kind == "checkpoint")
    t.expect_equal(head["choices"], num_choices, "the checkpoints name the number of choices")
    # What a client has after each data event: per choice, tokens, sampler state, finished.
    delivered = [{"index": i, "output_token_ids": [], "finished": False} for i in range(num_choices)]
    pending, cuts, events = [], [], []
    for kind, payload in items:
        if kind == "checkpoint":
            pending.append(payload)
            continue
        for checkpoint in pending:
            entry = delivered[checkpoint["index"]]
            entry["output_token_ids"] = entry["output_token_ids"] + checkpoint["token_ids"]
            if "sampler_state" in checkpoint:
                entry["sampler_state"] = checkpoint["sampler_state"]
        if '"finish_reason":"' in payload:
            delivered[pending[-1]["index"]]["finished"] = True
        pending = []
        events.append(payload)
        cuts.append(json.loads(json.dumps(delivered)))
    t.expect_equal(events[-1], "data: [DONE]", "the stream ends with [DONE]")
    t.expect(all(entry["finished"] for entry in delivered), "every choice finished")
    t.expect_equal(sorted(k for k in per_choice(events) if k is not None), list(range(num_choices)),
                   "every choice has events")
    # Cut points where a choice is left to finish, spread evenly.
    open_cuts = [i for i, state in enumerate(cuts)
                 if i >= head_events - 1 and not all(c["finished"] for c in state)]
    step = max(1, len(open_cuts) // MAX_RESUMES)
    final_lengths = [len(entry["output_token_ids"]) for entry in delivered]
    before_finish = [i for i in open_cuts
                     if any(len(c["output_token_ids"]) == final_lengths[c["index"]] and not c["finished"]
                            for c in cuts[i])]
    t.expect(bool(before_finish) == cuts_before_a_finish_chunk,
             f"cuts between a choice's last token and its finish chunk: {before_finish}")
    chosen = sorted(set(open_cuts[::step]) | set(before_finish))
    finished_before_the_end = 0
    for i in chosen:
        resume = {"id": head["id"], "created": head["created"], "choices": cuts[i]}
        status, rest = t.http("POST", url, dict(body, pdserve_resume=resume), headers=t.cluster_headers())
        t.expect_equal(status, 200, f"{path}: resume after event {i}: {rest[:300]}")
        got = [payload for kind, payload in split_stream(rest) if kind == "data"]
        t.expect(not any(kind == "checkpoint" for kind, _ in split_stream(rest)),
                 "a resume without X-Pdserve-Resumable has no checkpoints")
        want = events[i + 1:]
        got_by_choice, want_by_choice = per_choice(got), per_choice(want)
        for index in sorted(set(got_by_choice) | set(want_by_choice), key=lambda k: (k is None, k)):
            if got_by_choice.get(index, []) != want_by_choice.get(index, []):
                g, w = got_by_choice.get(index, []), want_by_choice.get(index, [])
                first = next((k for k, (a, b) in enumerate(zip(g, w)) if a != b), min(len(g), len(w)))
                raise AssertionError(
                    f"{path}: after a resume after event {i}, choice {index} has {len(g)} events, "
                    f"expected {len(w)}; first difference at {first}: "
                    f"got {g[first] if first < len(g) else None!r}, expected {w[first] if first < len(w) else None!r}")
        t.expect_equal(got[-1], "data: [DONE]", "a resumed stream ends with [DONE]")
        finished_before_the_end += any(c["finished"] for c in cuts[i])
    t.expect(len(chosen) >= min(MAX_RESUMES, len(open_cuts)) // 2 and finished_before_the_end > 0,
             f"{len(chosen)} cut points, {finished_before_the_end} with a choice already finished")
    return len(chosen)


def chat_with_three_choices():
    body = {"model": target.name, "stream": True, "n": 3, "seed": 5, "temperature": 1.0,
            "logprobs": True, "top_logprobs": 2, "stream_options": {"include_usage": True},
            "max_tokens": 24, "messages": [{"role": "user", "content": "Count to ten in French."}]}
    resumed = check_resumes("/v1/chat/completions", body, 3, head_events=3, cuts_before_a_finish_chunk=True)
    print(f"     chat n = 3: resumed at {resumed} points", flush=True)


def completions_of_two_prompts_with_two_choices():
    body = {"model": target.name, "stream": True, "n": 2, "seed": 9, "temperature": 1.0,
            "stream_options": {"include_usage": True}, "max_tokens": 20,
            "prompt": ["The capital of France is", "1, 2, 3, 4,"]}
    resumed = check_resumes("/v1/completions", body, 4, head_events=0, cuts_before_a_finish_chunk=False)
    print(f"     completions, 2 prompts x n = 2: resumed at {resumed} points", flush=True)


def malformed_resumes_are_refused():
    body = {"model": target.name, "stream": True, "n": 2, "max_tokens": 4, "prompt": "hi"}
    url = target.url + "/v1/completions"
    cases = [
        ({"id": "cmpl-1", "created": 1, "choices": [{"index": 0, "output_token_ids": []}]}, "has 1 choices"),
        ({"id": "cmpl-1", "created": 1, "choices": [{"index": 0, "output_token_ids": [], "finished": True},
                                                    {"index": 1, "output_token_ids": [], "finished": True}]},
         "every choice has finished"),
        ({"id": "cmpl-1", "created": 1, "choices": [{"index": 1, "output_token_ids": []},
                                                    {"index": 0, "output_token_ids": []}]}, "'index' must be 0"),
        ({"id": "cmpl-1", "created": 1, "choices": [{"index": 0, "output_token_ids": [3]},
                                                    {"index": 1, "output_token_ids": []}]}, "sampler_state"),
    ]
    for resume, mention in cases:
        status, text = t.http("POST", url, dict(body, pdserve_resume=resume), headers=t.cluster_headers())
        t.expect_equal(status, 400, f"{resume}: {text[:200]}")
        error = json.loads(text)["error"]
        t.expect(mention in error["message"] and error.get("param") == "pdserve_resume",
                 f"the 400 names the problem ({mention}): {error}")
    status, text = t.http("POST", url, dict(body, stream=False, pdserve_resume=cases[0][0]),
                          headers=t.cluster_headers())
    t.expect_equal(status, 400, f"a resume of a non-streamed request: {text[:200]}")


failed = t.run_checks([
    ("a chat stream with n = 3 resumed after any event continues each choice exactly", chat_with_three_choices),
    ("a completion stream of 2 prompts x n = 2 resumed after any event continues each choice exactly",
     completions_of_two_prompts_with_two_choices),
    ("malformed resumes are refused with a 400 naming the problem", malformed_resumes_are_refused),
])
t.finish(failed, target, "stream resumption checks with several choices")

"""Live oracle: pdserve's chat-template rendering (pdserve-tokenize --chat) against transformers'
own AutoTokenizer.apply_chat_template (Python Jinja2, what vLLM runs) for every committed
conversation: tests/data/chat/qwen3_golden.jsonl (tools, tool results, reasoning, multi-turn,
enable_thinking on/off, add_generation_prompt on/off) with the Qwen3 tokenizer's own template,
and the conversations of tests/data/chat/templates_golden.jsonl (Qwen2.5 and a QwQ-style
template) through --chat-template. Checked: the rendered text byte for byte, and the ids of
the rendered prompt.

Environment (set by CTest): PDSERVE_BUILD_DIR, PDSERVE_SOURCE_DIR.
"""
import json
import os
import subprocess
import sys
import tempfile

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")  # no "PyTorch was not found" banner
from transformers import AutoTokenizer  # noqa: E402

BUILD = os.environ["PDSERVE_BUILD_DIR"]
SOURCE = os.environ["PDSERVE_SOURCE_DIR"]
TOKENIZER_DIR = os.path.join(SOURCE, "configs/models/qwen3-tokenizer")
DATA = os.path.join(SOURCE, "tests/data/chat")
TOKENIZE = os.path.join(BUILD, "tools/tokenize/pdserve-tokenize")
HF_ARGUMENTS = ("messages", "tools", "add_generation_prompt")


def read_jsonl(name):
    with open(os.path.join(DATA, name), encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def hf_render(tokenizer, context, template=None, tokenize=False):
    kwargs = {k: v for k, v in context.items() if k not in HF_ARGUMENTS}
    return tokenizer.apply_chat_template(context["messages"], tools=context.get("tools"),
                                         add_generation_prompt=context.get("add_generation_prompt", False),
                                         chat_template=template, tokenize=tokenize, **kwargs)


def pdserve_render(contexts, *flags):
    payload = "".join(json.dumps(context, ensure_ascii=False) + "\n" for context in contexts)
    result = subprocess.run([TOKENIZE, "--model", TOKENIZER_DIR, "--chat", *flags], input=payload,
                            capture_output=True, text=True, timeout=120)
    if result.returncode != 0:
        raise SystemExit(f"pdserve-tokenize --chat {' '.join(flags)} failed: {result.stderr}")
    return [json.loads(line) for line in result.stdout.split("\n") if line]


def hf_ids(tokenizer, context, template):
    ids = hf_render(tokenizer, context, template, tokenize=True)
    return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)


def compare(tokenizer, name, contexts, template=None):
    """Text and ids of each context; returns the failures."""
    flags = []
    if template is not None:
        handle = tempfile.NamedTemporaryFile("w", suffix=".jinja", delete=False, encoding="utf-8")
        handle.write(template)
        handle.close()
        flags = ["--chat-template", handle.name]
    try:
        texts = pdserve_render(contexts, "--render", *flags)
        ids = pdserve_render(contexts, *flags)
    finally:
        if flags:
            os.unlink(flags[1])
    failures = []
    for i, context in enumerate(contexts):
        want = hf_render(tokenizer, context, template)
        if texts[i] != want:
            failures.append(f"{name} #{i}: rendered text differs\n  pdserve {texts[i]!r}\n  HF      {want!r}")
        elif ids[i] != hf_ids(tokenizer, context, template):
            failures.append(f"{name} #{i}: ids of the rendered prompt differ")
    return failures


def main():
    tokenizer = AutoTokenizer.from_pretrained(TOKENIZER_DIR)
    qwen3 = [case["context"] for case in read_jsonl("qwen3_golden.jsonl")]
    failures = compare(tokenizer, "qwen3", qwen3)
    other = [case for case in read_jsonl("templates_golden.jsonl")
             if "messages" in case["context"] and "error" not in case]
    for case in other:
        failures += compare(tokenizer, case["name"], [case["context"]], case["template"])
    for failure in failures:
        print("FAIL", failure)
    print(f"{len(qwen3)} Qwen3 conversations and {len(other)} with other templates: "
          f"{len(failures)} disagreement(s) with transformers' apply_chat_template")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

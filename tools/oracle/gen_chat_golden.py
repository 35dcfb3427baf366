"""Regenerates the chat-template golden files of tests/data/chat/ with transformers' own
AutoTokenizer.apply_chat_template (Python Jinja2, what vLLM and transformers run):
  qwen3_golden.jsonl      {"context", "rendered"}: Qwen3's template from
                          configs/models/qwen3-tokenizer on each conversation.
  templates_golden.jsonl  {"name", "template", "context", "rendered" | "error"}: the cases that
                          are conversations (a "messages" list: Qwen2.5 and QwQ-style templates)
                          are re-rendered; the interpreter-feature cases (no messages) keep the
                          answers of @huggingface/jinja, whose JavaScript semantics (true, not
                          True; lists printed as JSON) the interpreter follows outside what chat
                          templates rely on (common/chat/chat_template.h). Two of them carry
                          Python's answer where the interpreter follows Python on purpose:
                          string_methods (str.strip/lstrip/rstrip with chars) and
                          filters_tojson (json.dumps floats: 1.0, -0.0).
The contexts are what the files hold; only the outputs are recomputed. Prints what changed.

Usage: .venv/bin/python tools/oracle/gen_chat_golden.py [--check]
"""
import argparse
import json
import os
import sys

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
from transformers import AutoTokenizer  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
OUT = os.path.join(ROOT, "tests/data/chat")
HF_ARGUMENTS = ("messages", "tools", "add_generation_prompt")


def read_jsonl(path):
    with open(path, encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def write_jsonl(path, rows):
    with open(path, "w", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(row, ensure_ascii=False, separators=(",", ":")) + "\n")


def render(tokenizer, context, template=None):
    kwargs = {k: v for k, v in context.items() if k not in HF_ARGUMENTS}
    return tokenizer.apply_chat_template(context["messages"], tools=context.get("tools"),
                                         add_generation_prompt=context.get("add_generation_prompt", False),
                                         chat_template=template, tokenize=False, **kwargs)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="only report what would change")
    args = parser.parse_args()
    tokenizer = AutoTokenizer.from_pretrained(os.path.join(ROOT, "configs/models/qwen3-tokenizer"))

    def regenerate(name, rows, rerender):
        new = [rerender(row) for row in rows]
        changed = [i for i, (a, b) in enumerate(zip(rows, new)) if a != b]
        print(f"{name}: {len(new)} lines, {len(changed)} changed" + (f" (lines {[i + 1 for i in changed]})"
                                                                     if changed else ""))
        for i in changed:
            print(f"  line {i + 1}: {rows[i].get('rendered')!r}\n       -> {new[i].get('rendered')!r}")
        if not args.check:
            write_jsonl(os.path.join(OUT, name), new)

    regenerate("qwen3_golden.jsonl", read_jsonl(os.path.join(OUT, "qwen3_golden.jsonl")),
               lambda row: {"context": row["context"], "rendered": render(tokenizer, row["context"])})

    def rerender_case(row):
        if "messages" not in row["context"] or "error" in row:
            return row
        return {**row, "rendered": render(tokenizer, row["context"], row["template"])}

    regenerate("templates_golden.jsonl", read_jsonl(os.path.join(OUT, "templates_golden.jsonl")), rerender_case)
    return 0


if __name__ == "__main__":
    sys.exit(main())

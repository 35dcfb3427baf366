"""Regenerates the tokenizer golden files of tests/data/tokenizer/ with Hugging Face's own
`tokenizers` (the Rust tokenizer behind transformers) on configs/models/qwen3-tokenizer:
  golden.jsonl  {"text", "nfc", "ids"}: encode(text) without special tokens, and NFC(text)
                (the round-trip target of decode(encode)).
  decode.jsonl  {"ids", "skip_special", "text"}: decode(ids), including id sequences that cut
                multi-byte characters and random ids.
The corpus (the texts and id sequences) is what the files hold; only the outputs are
recomputed, so a changed line is a change in the oracle's answer. Prints how many changed.
(The corpus was first drawn by a seeded generator with an independent JS tokenizer; the live
test tests/tokenizer/hf_tokenizer_oracle_test.py adds thousands of fresh strings on every run.)

Usage: .venv/bin/python tools/oracle/gen_tokenizer_golden.py [--check]
"""
import argparse
import json
import os
import sys
import unicodedata

from tokenizers import Tokenizer

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
OUT = os.path.join(ROOT, "tests/data/tokenizer")


def read_jsonl(path):
    with open(path, encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def write_jsonl(path, rows):
    with open(path, "w", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(row, ensure_ascii=False, separators=(",", ":")) + "\n")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="only report what would change")
    args = parser.parse_args()
    tokenizer = Tokenizer.from_file(os.path.join(ROOT, "configs/models/qwen3-tokenizer/tokenizer.json"))
    for name, regenerate in (
            ("golden.jsonl", lambda row: {"text": row["text"], "nfc": unicodedata.normalize("NFC", row["text"]),
                                          "ids": tokenizer.encode(row["text"], add_special_tokens=False).ids}),
            ("decode.jsonl", lambda row: {"ids": row["ids"], "skip_special": row["skip_special"],
                                          "text": tokenizer.decode(row["ids"],
                                                                   skip_special_tokens=row["skip_special"])})):
        path = os.path.join(OUT, name)
        old = read_jsonl(path)
        new = [regenerate(row) for row in old]
        changed = sum(a != b for a, b in zip(old, new))
        print(f"{name}: {len(new)} lines, {changed} changed")
        if not args.check:
            write_jsonl(path, new)
    return 0


if __name__ == "__main__":
    sys.exit(main())

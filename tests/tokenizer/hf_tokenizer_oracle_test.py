"""Live oracle: pdserve's tokenizer (through pdserve-tokenize) against Hugging Face's own
`tokenizers` (the Rust tokenizer behind transformers) on the Qwen3 tokenizer.json, for the whole
golden corpus (tests/data/tokenizer) plus a few thousand seeded generated strings: random
assigned Unicode, whitespace runs, digit runs, code, mixed scripts with emoji sequences.
Checked: encode ids (no special tokens added), decode(ids) for the corpus's id sequences and
random ids, and decode(encode(s)) == NFC(s).

Environment (set by CTest): PDSERVE_BUILD_DIR, PDSERVE_SOURCE_DIR. Argument: how many strings to
generate (default 3000).
"""
import json
import os
import random
import subprocess
import sys
import unicodedata

from tokenizers import Tokenizer

BUILD = os.environ["PDSERVE_BUILD_DIR"]
SOURCE = os.environ["PDSERVE_SOURCE_DIR"]
TOKENIZER_DIR = os.path.join(SOURCE, "configs/models/qwen3-tokenizer")
GOLDEN_DIR = os.path.join(SOURCE, "tests/data/tokenizer")
TOKENIZE = os.path.join(BUILD, "tools/tokenize/pdserve-tokenize")
GENERATED = int(sys.argv[1]) if len(sys.argv) > 1 else 3000

# Python 3.11's Unicode database is 14.0; Debian 12's PCRE2 and utf8proc are on 14 too.
ASSIGNED = [c for c in range(0x20, 0x2FFFF)
            if unicodedata.category(chr(c)) not in ("Cn", "Cs", "Co") and not 0xD800 <= c <= 0xDFFF]
WHITESPACE = [" ", "  ", "\t", "\n", "\r\n", "\r", "\u00a0", "\u3000", "\u2009", "\u0085", "\ufeff", "\u200b",
              "\v", "\f", "\u2028"]
SCRIPTS = {
    "latin": "The quick brown fox jumps over the lazy dog Zürich façade naïve coöperate Ærøskøbing",
    "cyrillic": "Съешь же ещё этих мягких французских булок да выпей чаю",
    "greek": "Ξεσκεπάζω την ψυχοφθόρα βδελυγμία",
    "cjk": "北京是中华人民共和国的首都東京は日本の首都です서울은대한민국의수도입니다",
    "arabic": "نص حكيم له سر قاطع وذو شأن عظيم مكتوب على ثوب أخضر",
    "hebrew": "דג סקרן שט בים מאוכזב ולפתע מצא חברה",
    "devanagari": "ऋषियों को सताने वाले दुष्ट राक्षसों के राजा रावण का सर्वनाश करने वाले",
    "thai": "เป็นมนุษย์สุดประเสริฐเลิศคุณค่า",
    "emoji": "😀👍🏽👨‍👩‍👧‍👦🏳️‍🌈🇨🇭❤️‍🔥🧑🏿‍💻✌️1️⃣",
}
CODE = ["def", "return", "for", "in", "range", "(", ")", ":", "    ", "\n", "x", "=", "==", "+=", "self.", "[]", "{}",
        "'", '"', "#", "//", "/*", "*/", "->", "::", "std::vector<int>", "if", "else", "0x1F", "1e-9", ";", ",",
        "\t", "lambda", "async", "await", "=>", "&&", "||", "!=", "<=", ">=", "%", "**", "@decorator", "\\n"]


def random_unicode(rng):
    return "".join(chr(rng.choice(ASSIGNED)) for _ in range(rng.randint(1, 24)))


def whitespace_runs(rng):
    parts = []
    for _ in range(rng.randint(1, 8)):
        parts.append("".join(rng.choice(WHITESPACE) for _ in range(rng.randint(1, 6))))
        parts.append(rng.choice(["a", "word", "X", "1", "é", "中", ".", ""]))
    return "".join(parts)


def digit_runs(rng):
    return "".join(rng.choice([str(rng.randrange(10 ** rng.randint(1, 20))), " ", ".", ",", "-", "e", "x", "٣٤",
                               "１２", "½"]) for _ in range(rng.randint(1, 10)))


def code(rng):
    return " ".join(rng.choice(CODE) for _ in range(rng.randint(2, 30)))


def mixed_scripts(rng):
    parts = []
    for _ in range(rng.randint(1, 6)):
        text = SCRIPTS[rng.choice(list(SCRIPTS))]
        start = rng.randrange(len(text))
        parts.append(text[start:start + rng.randint(1, 20)])
        parts.append(rng.choice(["", " ", "\n", ", ", "'s ", "123"]))
    return "".join(parts)


def generated_strings(count, seed=20261123):
    rng = random.Random(seed)
    kinds = [random_unicode, whitespace_runs, digit_runs, code, mixed_scripts]
    return [kinds[i % len(kinds)](rng) for i in range(count)]


def pdserve_tokenize(lines, *flags):
    """One pdserve-tokenize process for all lines (one JSON value each way)."""
    payload = "".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines)
    result = subprocess.run([TOKENIZE, "--model", TOKENIZER_DIR, *flags], input=payload, capture_output=True,
                            text=True, timeout=300)
    if result.returncode != 0:
        raise SystemExit(f"pdserve-tokenize {' '.join(flags)} failed: {result.stderr}")
    outputs = [json.loads(line) for line in result.stdout.split("\n") if line]
    if len(outputs) != len(lines):
        raise SystemExit(f"pdserve-tokenize returned {len(outputs)} lines for {len(lines)}")
    return outputs


def read_jsonl(name):
    with open(os.path.join(GOLDEN_DIR, name), encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def main():
    hf = Tokenizer.from_file(os.path.join(TOKENIZER_DIR, "tokenizer.json"))
    failures = []

    corpus = [case["text"] for case in read_jsonl("golden.jsonl")]
    generated = generated_strings(GENERATED)
    texts = corpus + generated
    ours = pdserve_tokenize(texts)
    expected = [encoding.ids for encoding in hf.encode_batch(texts, add_special_tokens=False)]
    for text, got, want in zip(texts, ours, expected):
        if got != want:
            failures.append(f"encode {text!r}: pdserve {got[:16]} HF {want[:16]}")

    rng = random.Random(7)
    vocab = hf.get_vocab_size()
    id_lists = [case["ids"] for case in read_jsonl("decode.jsonl")] + \
               [[rng.randrange(vocab) for _ in range(rng.randint(1, 12))] for _ in range(1000)] + \
               [ids for ids in expected if ids]
    decoded = pdserve_tokenize(id_lists, "--decode")
    for ids, got in zip(id_lists, decoded):
        want = hf.decode(ids, skip_special_tokens=False)
        if got != want:
            failures.append(f"decode {ids[:12]}: pdserve {got!r} HF {want!r}")
    # Round trip: decode(encode(s)) == NFC(s) (the normalizer is NFC).
    round_trips = pdserve_tokenize(expected, "--decode")
    for text, got in zip(texts, round_trips):
        if got != unicodedata.normalize("NFC", text):
            failures.append(f"round trip {text!r}: {got!r}")

    for line in failures[:20]:
        print("FAIL", line)
    print(f"{len(texts)} strings ({len(corpus)} golden, {len(generated)} generated) and {len(id_lists)} id lists: "
          f"{len(failures)} disagreement(s) with Hugging Face tokenizers")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

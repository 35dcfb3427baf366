"""Deterministic token-id choices (prompts, probe sets) from a seed.

Uses SplitMix64 rather than a library RNG so that the ids never change with the Python or
torch version and can be reproduced in C++ if ever needed.

CLI: seeded_ids.py prompt --seed S --count N --vocab V   -> comma-separated prompt ids
"""

import argparse

_MASK64 = (1 << 64) - 1


class SplitMix64:
    def __init__(self, seed: int):
        self.state = seed & _MASK64

    def next(self) -> int:
        self.state = (self.state + 0x9E3779B97F4A7C15) & _MASK64
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
        return z ^ (z >> 31)


def stratified_ids(count: int, vocab_size: int, rng: SplitMix64) -> list:
    """One id drawn from each of `count` equal slices of [0, vocab_size): distinct, sorted."""
    if not 0 < count <= vocab_size:
        raise ValueError(f"cannot draw {count} distinct ids from a vocabulary of {vocab_size}")
    ids = []
    for stratum in range(count):
        low = stratum * vocab_size // count
        high = (stratum + 1) * vocab_size // count
        ids.append(low + rng.next() % (high - low))
    return ids


def probe_ids(count: int, vocab_size: int, seed: int) -> list:
    return stratified_ids(count, vocab_size, SplitMix64(seed))


def prompt_ids(count: int, vocab_size: int, seed: int) -> list:
    """Ids spread over the whole vocabulary, in a seeded shuffled order (Fisher-Yates)."""
    rng = SplitMix64(seed)
    ids = stratified_ids(count, vocab_size, rng)
    for i in range(len(ids) - 1, 0, -1):
        j = rng.next() % (i + 1)
        ids[i], ids[j] = ids[j], ids[i]
    return ids


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("kind", choices=["prompt", "probe"])
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--count", type=int, required=True)
    parser.add_argument("--vocab", type=int, required=True)
    args = parser.parse_args()
    choose = prompt_ids if args.kind == "prompt" else probe_ids
    try:
        ids = choose(args.count, args.vocab, args.seed)
    except ValueError as error:
        parser.error(str(error))
    print(",".join(str(i) for i in ids))


if __name__ == "__main__":
    main()

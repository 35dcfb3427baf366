"""Golden logits from Hugging Face transformers' own Qwen3ForCausalLM: the gold standard for
pdserve's forward pass (tests/kernels/qwen3_golden_test.cpp, shape "transformers_*").

1. pdserve-make-model writes a synthetic checkpoint of the real Qwen3-0.6B widths with few
   layers (bf16, seeded: configs/models/qwen3-0.6b/config.json, --layers, --seed).
2. transformers builds Qwen3ForCausalLM from that config.json, loads the weights strictly
   (every tensor used, none missing), and writes the model again with save_pretrained. The
   script requires save_pretrained's model.safetensors to be byte-identical to
   pdserve-make-model's, so the checkpoint CI rebuilds from the seed is exactly the file
   transformers writes; its SHA-256 goes into the golden.
3. The forward runs in float64 (bf16 weights upcast exactly) with eager attention: logits at
   every prompt position, then 16 greedy steps through transformers' KV cache. A float32 run
   gives its greedy ids too ("float32_greedy_ids"), as the precision the CPU backend uses.
The output is a pdserve-golden-logits-v1 file (tests/reference/README.md) plus an "oracle"
record of the versions, and transformers' config.json beside it (NAME.config.json), which the
CI test puts in the rebuilt checkpoint in place of pdserve's. It needs PyTorch: run it once where PyTorch exists, e.g.
  python3 -m venv /tmp/venv-torch && /tmp/venv-torch/bin/pip install torch transformers safetensors
  /tmp/venv-torch/bin/python tools/oracle/gen_transformers_golden.py --build-dir build
The CI test needs no PyTorch: it rebuilds the checkpoint with pdserve's writer and compares.
"""
import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile

import torch
import transformers
from safetensors.torch import load_file
from transformers import Qwen3Config, Qwen3ForCausalLM

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tests/reference"))
from qwen3_reference import PROBE_COUNT, PROBE_SEED, TOP_K, write_golden  # noqa: E402
from seeded_ids import probe_ids, prompt_ids  # noqa: E402

CONFIG = "configs/models/qwen3-0.6b/config.json"


def sha256(path):
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def summarize(logits, probes):
    """Top-k (ties: lower id first), probe logits and logsumexp of one float64 row."""
    order = torch.sort(logits, descending=True, stable=True).indices[:TOP_K]
    return {"top_ids": order.tolist(), "top_logits": logits[order].tolist(),
            "probe_logits": logits[probes].tolist(), "logsumexp": torch.logsumexp(logits, dim=0).item()}


@torch.no_grad()
def run(model, prompt, steps, probes):
    """Prefill, then feed back the greedy token `steps` times through the model's KV cache."""
    probe_index = torch.tensor(probes)
    out = model(input_ids=torch.tensor([prompt]), use_cache=True)
    rows = out.logits[0].to(torch.float64)
    prompt_positions = [{"position": p, **summarize(row, probe_index)} for p, row in enumerate(rows)]
    cache, next_token, decode_steps = out.past_key_values, int(torch.argmax(rows[-1])), []
    for step in range(steps):
        out = model(input_ids=torch.tensor([[next_token]]), past_key_values=cache, use_cache=True)
        cache = out.past_key_values
        summary = summarize(out.logits[0, -1].to(torch.float64), probe_index)
        greedy = summary["top_ids"][0]
        decode_steps.append({"position": len(prompt) + step, "input_token": next_token, "greedy_token": greedy,
                             **summary, "margin": summary["top_logits"][0] - summary["top_logits"][1]})
        next_token = greedy
    return prompt_positions, decode_steps


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--build-dir", default=os.path.join(ROOT, "build"))
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--prompt-seed", type=int, default=105)
    parser.add_argument("--prompt-length", type=int, default=40)
    parser.add_argument("--decode-steps", type=int, default=16)
    parser.add_argument("--out", default=os.path.join(ROOT, "tests/data/reference/transformers_qwen3_0_6b_2layers.json"))
    args = parser.parse_args()
    torch.manual_seed(0)

    with tempfile.TemporaryDirectory() as work:
        ours, theirs = os.path.join(work, "pdserve"), os.path.join(work, "transformers")
        subprocess.run([os.path.join(args.build_dir, "tools/make_model/pdserve-make-model"), "--config",
                        os.path.join(ROOT, CONFIG), "--out", ours, "--seed", str(args.seed), "--layers",
                        str(args.layers), "--dtype", "bfloat16", "--tie"], check=True, stdout=subprocess.DEVNULL)
        config = Qwen3Config.from_pretrained(ours)
        config._attn_implementation = "eager"
        model = Qwen3ForCausalLM(config).to(torch.bfloat16)
        state = load_file(os.path.join(ours, "model.safetensors"))
        missing, unexpected = model.load_state_dict(state, strict=False)
        # Tied embeddings: lm_head.weight is model.embed_tokens.weight and absent from the file.
        if unexpected or [m for m in missing if m != "lm_head.weight"]:
            sys.exit(f"weights do not fit Qwen3ForCausalLM: missing {missing}, unexpected {unexpected}")
        model.tie_weights()
        model.save_pretrained(theirs)
        checkpoint_sha = sha256(os.path.join(theirs, "model.safetensors"))
        if checkpoint_sha != sha256(os.path.join(ours, "model.safetensors")):
            sys.exit("save_pretrained wrote other bytes than pdserve-make-model: the CI checkpoint would differ")
        # transformers' own config.json (rope_parameters, layer_types, dtype): CI loads the
        # checkpoint with it.
        shutil.copyfile(os.path.join(theirs, "config.json"), args.out.removesuffix(".json") + ".config.json")

        vocab = config.vocab_size
        prompt = prompt_ids(args.prompt_length, vocab, args.prompt_seed)
        probes = probe_ids(PROBE_COUNT, vocab, PROBE_SEED)
        reloaded = Qwen3ForCausalLM.from_pretrained(theirs, torch_dtype=torch.float64, attn_implementation="eager")
        reloaded.eval()
        prompt_positions, decode_steps = run(reloaded, prompt, args.decode_steps, probes)
        float32 = Qwen3ForCausalLM.from_pretrained(theirs, torch_dtype=torch.float32, attn_implementation="eager")
        float32.eval()
        _, steps32 = run(float32, prompt, args.decode_steps, probes)

    golden = {
        "format": "pdserve-golden-logits-v1",
        "model": {"config": CONFIG, "seed": args.seed, "layers": args.layers, "dtype": "bfloat16", "tie": "tie",
                  "checkpoint_config": os.path.relpath(args.out.removesuffix(".json") + ".config.json", ROOT),
                  "safetensors_sha256": checkpoint_sha},
        "oracle": {"implementation": "transformers Qwen3ForCausalLM (eager attention), float64",
                   "transformers": transformers.__version__, "torch": torch.__version__,
                   "float32_greedy_ids": [s["greedy_token"] for s in steps32]},
        "prompt_ids": prompt,
        "probe_ids": probes,
        "prompt_positions": prompt_positions,
        "decode_steps": decode_steps,
    }
    write_golden(args.out, golden)
    agree = golden["oracle"]["float32_greedy_ids"] == [s["greedy_token"] for s in decode_steps]
    print(f"wrote {args.out}: transformers {transformers.__version__}, torch {torch.__version__}, "
          f"checkpoint sha256 {checkpoint_sha[:16]}..., float32 greedy ids {'equal' if agree else 'differ from'} "
          "the float64 ones")
    return 0


if __name__ == "__main__":
    sys.exit(main())

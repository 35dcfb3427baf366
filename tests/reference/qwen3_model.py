"""Independent reference forward pass of Qwen3ForCausalLM (Hugging Face semantics).

Everything runs in one torch float dtype (float64 for goldens); checkpoint weights are upcast
exactly. The code follows the math of HF `modeling_qwen3.py`, not its structure.
"""

import json
import math
from dataclasses import dataclass

import torch

from safetensors_reader import Checkpoint, CheckpointError


@dataclass(frozen=True)
class Qwen3Config:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float
    rms_norm_eps: float
    tie_word_embeddings: bool

    @staticmethod
    def from_json_file(path: str) -> "Qwen3Config":
        try:
            with open(path, encoding="utf-8") as handle:
                raw = json.load(handle)
        except (OSError, json.JSONDecodeError) as error:
            raise CheckpointError(f"{path}: cannot read config: {error}") from error
        if not isinstance(raw, dict):
            raise CheckpointError(f"{path}: config is not a JSON object")
        return Qwen3Config.from_dict(raw, path)

    @staticmethod
    def from_dict(raw: dict, path: str) -> "Qwen3Config":
        def integer(key, default=None):
            value = raw.get(key, default)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise CheckpointError(f"{path}: '{key}' must be a positive integer, got {value!r}")
            return value

        def number(key):
            value = raw.get(key)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
                raise CheckpointError(f"{path}: '{key}' must be a positive number, got {value!r}")
            return float(value)

        # Features this reference does not model must be off, never silently ignored.
        unsupported = {
            "hidden_act": ("silu", raw.get("hidden_act", "silu")),
            "attention_bias": (False, raw.get("attention_bias", False)),
            "rope_scaling": (None, raw.get("rope_scaling")),
            "use_sliding_window": (False, raw.get("use_sliding_window", False)),
        }
        for key, (required, actual) in unsupported.items():
            if actual != required:
                raise CheckpointError(f"{path}: '{key}' = {actual!r} is not supported "
                                      f"(need {required!r})")
        hidden_size = integer("hidden_size")
        num_heads = integer("num_attention_heads")
        config = Qwen3Config(
            vocab_size=integer("vocab_size"),
            hidden_size=hidden_size,
            intermediate_size=integer("intermediate_size"),
            num_layers=integer("num_hidden_layers"),
            num_heads=num_heads,
            num_kv_heads=integer("num_key_value_heads"),
            head_dim=integer("head_dim", hidden_size // num_heads),
            rope_theta=number("rope_theta"),
            rms_norm_eps=number("rms_norm_eps"),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
        )
        if config.num_heads % config.num_kv_heads != 0:
            raise CheckpointError(f"{path}: num_attention_heads {config.num_heads} is not a "
                                  f"multiple of num_key_value_heads {config.num_kv_heads}")
        if config.head_dim % 2 != 0:
            raise CheckpointError(f"{path}: head_dim {config.head_dim} must be even for RoPE")
        return config


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """weight * x / sqrt(mean(x^2) + eps) over the last dimension."""
    return weight * (x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps))


def rope_inv_freq(head_dim: int, theta: float, dtype: torch.dtype) -> torch.Tensor:
    """inv_freq[i] = 1 / theta^(2i / head_dim), i in [0, head_dim / 2)."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim
    return (1.0 / torch.pow(torch.tensor(theta, dtype=torch.float64), exponents)).to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rope(x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """HF rotate_half layout: element i pairs with element i + head_dim/2. x: [T, heads, D]."""
    angles = positions.to(inv_freq.dtype)[:, None] * inv_freq[None, :]
    angles = torch.cat((angles, angles), dim=-1)[:, None, :]
    return x * torch.cos(angles) + rotate_half(x) * torch.sin(angles)


def causal_gqa_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                         q_positions: torch.Tensor) -> torch.Tensor:
    """q: [T, H, D] at absolute q_positions; k, v: [S, KV, D] for positions 0..S-1.

    Query head h reads kv head h // (H / KV), as HF repeat_kv does. Returns [T, H * D].
    """
    tokens, num_heads, head_dim = q.shape
    num_kv_heads = k.shape[1]
    grouped_q = q.reshape(tokens, num_kv_heads, num_heads // num_kv_heads, head_dim)
    scores = torch.einsum("tgrd,sgd->grts", grouped_q, k) / math.sqrt(head_dim)
    key_positions = torch.arange(k.shape[0])
    future = key_positions[None, :] > q_positions[:, None]
    scores = scores.masked_fill(future, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    return torch.einsum("grts,sgd->tgrd", probs, v).reshape(tokens, num_heads * head_dim)


class KVCache:
    """Post-RoPE keys and values per layer, [S, KV, D] each."""

    def __init__(self, num_layers: int):
        self.keys = [None] * num_layers
        self.values = [None] * num_layers

    @property
    def length(self) -> int:
        return 0 if self.keys[0] is None else self.keys[0].shape[0]

    def append(self, layer: int, k: torch.Tensor, v: torch.Tensor):
        if self.keys[layer] is not None:
            k = torch.cat((self.keys[layer], k))
            v = torch.cat((self.values[layer], v))
        self.keys[layer], self.values[layer] = k, v
        return k, v


def _layer_tensor_shapes(config: Qwen3Config) -> dict:
    q_width = config.num_heads * config.head_dim
    kv_width = config.num_kv_heads * config.head_dim
    return {
        "input_layernorm.weight": [config.hidden_size],
        "self_attn.q_proj.weight": [q_width, config.hidden_size],
        "self_attn.k_proj.weight": [kv_width, config.hidden_size],
        "self_attn.v_proj.weight": [kv_width, config.hidden_size],
        "self_attn.q_norm.weight": [config.head_dim],
        "self_attn.k_norm.weight": [config.head_dim],
        "self_attn.o_proj.weight": [config.hidden_size, q_width],
        "post_attention_layernorm.weight": [config.hidden_size],
        "mlp.gate_proj.weight": [config.intermediate_size, config.hidden_size],
        "mlp.up_proj.weight": [config.intermediate_size, config.hidden_size],
        "mlp.down_proj.weight": [config.hidden_size, config.intermediate_size],
    }


def expected_tensor_shapes(config: Qwen3Config) -> dict:
    """Every tensor the model reads, by HF name, with its shape."""
    shapes = {
        "model.embed_tokens.weight": [config.vocab_size, config.hidden_size],
        "model.norm.weight": [config.hidden_size],
    }
    if not config.tie_word_embeddings:
        shapes["lm_head.weight"] = [config.vocab_size, config.hidden_size]
    for layer in range(config.num_layers):
        for suffix, shape in _layer_tensor_shapes(config).items():
            shapes[f"model.layers.{layer}.{suffix}"] = shape
    return shapes


class Qwen3Reference:
    """Qwen3ForCausalLM forward in one float dtype; call forward() repeatedly with a KVCache."""

    def __init__(self, config: Qwen3Config, weights: dict, dtype: torch.dtype):
        self.config = config
        self.weights = weights
        self.dtype = dtype
        self.inv_freq = rope_inv_freq(config.head_dim, config.rope_theta, dtype)
        head = "model.embed_tokens.weight" if config.tie_word_embeddings else "lm_head.weight"
        self.lm_head = weights[head]

    @staticmethod
    def from_checkpoint(model_dir: str, dtype: torch.dtype) -> "Qwen3Reference":
        config = Qwen3Config.from_json_file(f"{model_dir}/config.json")
        with Checkpoint(model_dir) as checkpoint:
            weights = load_weights(checkpoint, config, dtype)
        return Qwen3Reference(config, weights, dtype)

    def new_cache(self) -> KVCache:
        return KVCache(self.config.num_layers)

    def forward(self, token_ids: list, cache: KVCache) -> torch.Tensor:
        """Feeds token_ids at positions cache.length.. and returns their logits [T, vocab]."""
        config = self.config
        for index, token in enumerate(token_ids):
            if not 0 <= token < config.vocab_size:
                raise CheckpointError(f"token id {token} at input index {index} is outside "
                                      f"the vocabulary [0, {config.vocab_size})")
        positions = torch.arange(cache.length, cache.length + len(token_ids))
        hidden = self.weights["model.embed_tokens.weight"][torch.tensor(token_ids)]
        for layer in range(config.num_layers):
            hidden = self._decoder_layer(layer, hidden, positions, cache)
        hidden = rms_norm(hidden, self.weights["model.norm.weight"], config.rms_norm_eps)
        return hidden @ self.lm_head.T

    def _decoder_layer(self, layer: int, hidden: torch.Tensor, positions: torch.Tensor,
                       cache: KVCache) -> torch.Tensor:
        config = self.config
        w = {suffix: self.weights[f"model.layers.{layer}.{suffix}"]
             for suffix in _layer_tensor_shapes(config)}
        tokens = hidden.shape[0]

        x = rms_norm(hidden, w["input_layernorm.weight"], config.rms_norm_eps)
        q = (x @ w["self_attn.q_proj.weight"].T).reshape(tokens, config.num_heads, -1)
        k = (x @ w["self_attn.k_proj.weight"].T).reshape(tokens, config.num_kv_heads, -1)
        v = (x @ w["self_attn.v_proj.weight"].T).reshape(tokens, config.num_kv_heads, -1)
        q = rms_norm(q, w["self_attn.q_norm.weight"], config.rms_norm_eps)
        k = rms_norm(k, w["self_attn.k_norm.weight"], config.rms_norm_eps)
        q = apply_rope(q, positions, self.inv_freq)
        k = apply_rope(k, positions, self.inv_freq)
        all_k, all_v = cache.append(layer, k, v)
        attention = causal_gqa_attention(q, all_k, all_v, positions)
        hidden = hidden + attention @ w["self_attn.o_proj.weight"].T

        x = rms_norm(hidden, w["post_attention_layernorm.weight"], config.rms_norm_eps)
        gate = torch.nn.functional.silu(x @ w["mlp.gate_proj.weight"].T)
        up = x @ w["mlp.up_proj.weight"].T
        return hidden + (gate * up) @ w["mlp.down_proj.weight"].T


def load_weights(checkpoint: Checkpoint, config: Qwen3Config, dtype: torch.dtype) -> dict:
    """Loads and shape-checks every tensor the model needs; rejects unknown tensors."""
    expected = expected_tensor_shapes(config)
    present = checkpoint.names()
    where = checkpoint.model_dir
    missing = sorted(set(expected) - present)
    if missing:
        raise CheckpointError(f"{where}: missing tensors: {', '.join(missing[:8])}"
                              + (f" and {len(missing) - 8} more" if len(missing) > 8 else ""))
    unexpected = sorted(present - set(expected) - {"lm_head.weight"})
    if unexpected:
        raise CheckpointError(f"{where}: unexpected tensors (wrong num_hidden_layers?): "
                              f"{', '.join(unexpected[:8])}")
    if config.tie_word_embeddings and "lm_head.weight" in present:
        raise CheckpointError(f"{where}: tie_word_embeddings is true but lm_head.weight is "
                              "present; which one is the output head is ambiguous")
    weights = {}
    for name, shape in expected.items():
        if checkpoint.shape_of(name) != shape:
            raise CheckpointError(f"{where}: tensor '{name}' has shape "
                                  f"{checkpoint.shape_of(name)}, config implies {shape}")
        weights[name] = checkpoint.load(name, dtype)
    return weights

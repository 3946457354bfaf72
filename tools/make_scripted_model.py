"""A scripted kimi_k3 checkpoint: greedy decoding after the chat prompt emits one fixed reply.

Writes tests/fixtures/scripted-kimi-k3/ (about 370 KB): config.json, model.safetensors, the
tokenizer and chat template of models/tiny-kimi-k3 (copied byte for byte: same 1,024-token
vocabulary) and scripted_reply.json (the reply's token ids, for the server tests).

The reply (SCRIPT below) is a reasoning sentence closed by </think>, one Kimi tool call
(functions.get_weather:0 with {"city": "Paris"}) and <|im_end|>, the tokenizer's EOS.
The chat template's generation prompt ends with <think>, so the reasoning needs no opening
marker; the script renders the template to find that last prompt token (the "trigger").

Construction. The model is a successor table: token t -> f(t).

    h = embed(t)                      residual stream of a chain token: a one-hot direction
    every layer: h += attn(rms(h))    = 0: o_proj weights are zero
                 h += mlp(rms(h))     = 0: dense down_proj, every expert's w2 and the shared
                                        expert's down_proj are zero
    logits = lm_head(rms(h))

  - chain = [trigger, reply token 0, reply token 1, ..., <|im_end|>]; f maps each chain
    token to the next one. f depends on the current token only, so every token of the chain
    occurs once in it: the reply is cut into vocabulary tokens with no id repeated (a search
    over segmentations; special markers by id) and the script asserts that the ids decode
    to exactly SCRIPT.
  - The k-th chain token with a successor (all but <|im_end|>) has embed row e_k (one-hot,
    value 1; hidden_size >= their number). After the final RMSNorm (weights 1) the stream is
    e_k * sqrt(D / (1 + D * eps)), about 8 * e_k for D = 64.
  - lm_head row f(t) = LOGIT_SCALE * e_k, so the successor's logit is about 64 and every
    other logit is exactly 0. All other embed and lm_head rows are zero.
  - Attention, KDA, indexer and MoE internals hold small seeded random values (norm weights
    1, biases 0), so the engine runs every path on non-trivial numbers; the zero output
    projections make their contribution exactly 0 whatever those numbers are.

So greedy decoding follows f from the prompt's last token, whatever came before it. The
template with chat_template_kwargs.thinking=false ends the prompt with </think>, which is in
the chain too: the reply is then the tool call without reasoning.

Deterministic (fixed seed, bf16 rounded to nearest even, sorted tensor names): a re-run
reproduces every byte.
Usage: python tools/make_scripted_model.py   (numpy and jinja2; e.g. /work/venv/bin/python)
"""

import base64
import json
import shutil
import struct
from pathlib import Path

import jinja2
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
SOURCE_DIR = ROOT / "models" / "tiny-kimi-k3"
OUT_DIR = ROOT / "tests" / "fixtures" / "scripted-kimi-k3"
COPIED_FILES = ["tiktoken.model", "tokenizer_config.json"]

SEED = 20261130
LOGIT_SCALE = 8.0
INTERNAL_STD = 0.1  # random internals (never reach the residual stream)

# Kimi's reserved special tokens used here, as offsets from the base vocabulary size N
# (src/tokenizer/tiktoken_tokenizer.cpp, kKimiDefaultSpecialTokens).
SPECIAL_OFFSETS = {
    "<|im_end|>": 2, "<|im_user|>": 3, "<|im_assistant|>": 4, "<|im_system|>": 10,
    "<|tool_calls_section_begin|>": 11, "<|tool_calls_section_end|>": 12,
    "<|tool_call_begin|>": 13, "<|tool_call_argument_begin|>": 14, "<|tool_call_end|>": 15,
    "<|im_middle|>": 17, "<think>": 22, "</think>": 23,
}

# The reply: plain text and special markers, in order.
# No final period: the only token that can spell the "." of functions.get_weather is the
# single byte, and a token may occur once. Words ending in a lone "s" are avoided for the
# same reason ("functions" needs it). The two "Paris" differ: "Paris" here, "Par" "is" in
# the arguments.
REASONING = "The user would like the weather in Paris"
ARGUMENTS = '{"city": "Paris"}'
SCRIPT = [
    REASONING, "</think>",
    "<|tool_calls_section_begin|>",
    "<|tool_call_begin|>", "functions.get_weather:0", "<|tool_call_argument_begin|>",
    ARGUMENTS, "<|tool_call_end|>",
    "<|tool_calls_section_end|>",
    "<|im_end|>",
]

CONFIG = {
    "architectures": ["KimiK3ForCausalLM"],
    "model_type": "kimi_k3",
    "vocab_size": 1024,
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "layer_types": ["linear_attention", "full_attention"],
    "mlp_layer_types": ["dense", "sparse"],
    "rms_norm_eps": 1e-05,
    "tie_word_embeddings": False,
    "bos_token_id": 768,
    "eos_token_id": 770,
    "pad_token_id": 0,
    "max_position_embeddings": 4096,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "q_lora_rank": 16,
    "kv_lora_rank": 16,
    "qk_nope_head_dim": 8,
    "qk_rope_head_dim": 8,
    "v_head_dim": 8,
    "mla_use_nope": True,
    "mla_output_gate": True,
    "linear_num_heads": 2,
    "linear_head_dim": 16,
    "linear_conv_kernel_dim": 4,
    "intermediate_size": 32,
    "moe_intermediate_size": 16,
    "num_experts": 4,
    "num_experts_per_token": 2,
    "num_shared_experts": 1,
    "first_k_dense_replace": 1,
    "moe_router_activation_func": "sigmoid",
    "moe_renormalize": True,
    "routed_scaling_factor": 2.5,
    "num_expert_group": 1,
    "topk_group": 1,
    "index_n_heads": 2,
    "index_head_dim": 32,
    "index_topk": 8,
    "torch_dtype": "bfloat16",
}


class Vocab:
    """Token bytes of the bundled tokenizer: base ids from tiktoken.model, specials by name."""

    def __init__(self, model_dir):
        self.base = []
        for line in (model_dir / "tiktoken.model").read_text().splitlines():
            token, rank = line.split()
            assert int(rank) == len(self.base), "tiktoken.model ranks must be dense"
            self.base.append(base64.b64decode(token))
        self.base_ids = {b: i for i, b in enumerate(self.base)}
        self.max_len = max(len(b) for b in self.base)
        self.special_ids = {name: len(self.base) + off for name, off in SPECIAL_OFFSETS.items()}
        self.special_names = {i: name for name, i in self.special_ids.items()}

    def decode(self, ids):
        return b"".join(self.special_names[i].encode() if i in self.special_names
                        else self.base[i] for i in ids).decode()

    def segment_without_repeats(self, parts):
        """Ids for `parts` (special names or plain text) with no id used twice.

        Depth-first over segmentations: longest token first, then lowest id; deterministic.
        """
        items = [(self.special_ids[p],) if p in self.special_ids else p.encode() for p in parts]

        def search(index, pos, used):
            if index == len(items):
                return []
            item = items[index]
            if isinstance(item, tuple):
                if item[0] in used:
                    return None
                rest = search(index + 1, 0, used | {item[0]})
                return None if rest is None else [item[0]] + rest
            if pos == len(item):
                return search(index + 1, 0, used)
            for length in range(min(self.max_len, len(item) - pos), 0, -1):
                token_id = self.base_ids.get(item[pos:pos + length])
                if token_id is None or token_id in used:
                    continue
                rest = search(index, pos + length, used | {token_id})
                if rest is not None:
                    return [token_id] + rest
            return None

        ids = search(0, 0, frozenset())
        assert ids is not None, "no segmentation of the script without a repeated token"
        return ids


def generation_prompt_last_token(vocab, thinking):
    """The last token of a rendered one-user-message chat prompt (a special token)."""
    config = json.loads((SOURCE_DIR / "tokenizer_config.json").read_text())
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
    kwargs = {} if thinking else {"thinking": False}
    text = env.from_string(config["chat_template"]).render(
        messages=[{"role": "user", "content": "What is the weather in Paris?"}],
        add_generation_prompt=True, **kwargs)
    for name, token_id in vocab.special_ids.items():
        if text.endswith(name):
            return token_id
    raise AssertionError(f"the generation prompt does not end with a special token: {text!r}")


def to_bf16_bytes(values):
    """float32 array -> bf16 bytes (round to nearest even), little-endian."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return rounded.astype("<u2").tobytes()


def write_safetensors(path, tensors):
    """tensors: name -> float32 array, stored as BF16 in sorted name order."""
    header, chunks, offset = {"__metadata__": {"format": "pt"}}, [], 0
    for name in sorted(tensors):
        data = to_bf16_bytes(tensors[name])
        header[name] = {"dtype": "BF16", "shape": list(tensors[name].shape),
                        "data_offsets": [offset, offset + len(data)]}
        chunks.append(data)
        offset += len(data)
    header_bytes = json.dumps(header, separators=(",", ":")).encode()
    header_bytes += b" " * (-len(header_bytes) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(header_bytes)))
        f.write(header_bytes)
        for chunk in chunks:
            f.write(chunk)


def build_tensors(c, chain, rng):
    d = c["hidden_size"]
    random = lambda *shape: (rng.standard_normal(shape) * INTERNAL_STD).astype(np.float32)
    zeros = lambda *shape: np.zeros(shape, np.float32)
    ones = lambda *shape: np.ones(shape, np.float32)

    embed, lm_head = zeros(c["vocab_size"], d), zeros(c["vocab_size"], d)
    assert len(chain) - 1 <= d, f"{len(chain) - 1} chain tokens need hidden_size >= that"
    for k, (token, successor) in enumerate(zip(chain, chain[1:])):
        embed[token, k] = 1.0
        lm_head[successor, k] = LOGIT_SCALE
    t = {"model.embed_tokens.weight": embed, "lm_head.weight": lm_head,
         "model.norm.weight": ones(d)}

    h, dn, dr, dv = (c["num_attention_heads"], c["qk_nope_head_dim"], c["qk_rope_head_dim"],
                     c["v_head_dim"])
    q_lora, kv_lora = c["q_lora_rank"], c["kv_lora_rank"]
    hk, k_dim, kw = c["linear_num_heads"], c["linear_head_dim"], c["linear_conv_kernel_dim"]
    hi, di = c["index_n_heads"], c["index_head_dim"]
    moe_w = c["moe_intermediate_size"]
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = ones(d)
        t[p + "post_attention_layernorm.weight"] = ones(d)
        a = p + "self_attn."
        if c["layer_types"][i] == "linear_attention":
            width = hk * k_dim
            for x in "qkv":
                t[a + f"{x}_proj.weight"] = random(width, d)
                t[a + f"{x}_conv1d.weight"] = random(width, 1, kw)
            t[a + "f_a_proj.weight"] = random(k_dim, d)
            t[a + "f_b_proj.weight"] = random(width, k_dim)
            t[a + "b_proj.weight"] = random(hk, d)
            t[a + "g_a_proj.weight"] = random(k_dim, d)
            t[a + "g_b_proj.weight"] = random(width, k_dim)
            t[a + "A_log"] = random(1, 1, hk, 1)
            t[a + "dt_bias"] = random(width)
            t[a + "o_norm.weight"] = ones(k_dim)
            t[a + "o_proj.weight"] = zeros(d, width)
        else:
            t[a + "q_a_proj.weight"] = random(q_lora, d)
            t[a + "q_a_layernorm.weight"] = ones(q_lora)
            t[a + "q_b_proj.weight"] = random(h * (dn + dr), q_lora)
            t[a + "kv_a_proj_with_mqa.weight"] = random(kv_lora + dr, d)
            t[a + "kv_a_layernorm.weight"] = ones(kv_lora)
            t[a + "kv_b_proj.weight"] = random(h * (dn + dv), kv_lora)
            t[a + "g_proj.weight"] = random(h * dv, d)
            t[a + "o_proj.weight"] = zeros(d, h * dv)
            t[a + "indexer.wq_b.weight"] = random(hi * di, q_lora)
            t[a + "indexer.wk.weight"] = random(di, d)
            t[a + "indexer.k_norm.weight"] = ones(di)
            t[a + "indexer.k_norm.bias"] = zeros(di)
            t[a + "indexer.weights_proj.weight"] = random(hi, d)
        if c["mlp_layer_types"][i] == "dense":
            m, width = p + "mlp.", c["intermediate_size"]
            t[m + "gate_proj.weight"] = random(width, d)
            t[m + "up_proj.weight"] = random(width, d)
            t[m + "down_proj.weight"] = zeros(d, width)
        else:
            m = p + "block_sparse_moe."
            t[m + "gate.weight"] = random(c["num_experts"], d)
            t[m + "gate.e_score_correction_bias"] = random(c["num_experts"])
            for e in range(c["num_experts"]):
                t[m + f"experts.{e}.w1.weight"] = random(moe_w, d)
                t[m + f"experts.{e}.w3.weight"] = random(moe_w, d)
                t[m + f"experts.{e}.w2.weight"] = zeros(d, moe_w)
            shared_w = moe_w * c["num_shared_experts"]
            t[m + "shared_experts.gate_proj.weight"] = random(shared_w, d)
            t[m + "shared_experts.up_proj.weight"] = random(shared_w, d)
            t[m + "shared_experts.down_proj.weight"] = zeros(d, shared_w)
    return t


def main():
    vocab = Vocab(SOURCE_DIR)
    assert len(vocab.base) + 256 == CONFIG["vocab_size"]
    assert CONFIG["eos_token_id"] == vocab.special_ids["<|im_end|>"]

    trigger = generation_prompt_last_token(vocab, thinking=True)
    assert trigger == vocab.special_ids["<think>"], "expected the prompt to end with <think>"
    no_thinking_last = generation_prompt_last_token(vocab, thinking=False)

    reply = vocab.segment_without_repeats(SCRIPT)
    text = "".join(SCRIPT)
    assert vocab.decode(reply) == text, (vocab.decode(reply), text)
    chain = [trigger] + reply
    assert len(set(chain)) == len(chain), "a chain token repeats: f would not be a function"
    assert reply[-1] == CONFIG["eos_token_id"]
    assert no_thinking_last in chain, "the thinking=false prompt must end on a chain token"

    OUT_DIR.mkdir(parents=True, exist_ok=True)
    (OUT_DIR / "config.json").write_text(json.dumps(CONFIG, indent=1) + "\n")
    for name in COPIED_FILES:
        shutil.copyfile(SOURCE_DIR / name, OUT_DIR / name)
    rng = np.random.default_rng(SEED)
    write_safetensors(OUT_DIR / "model.safetensors", build_tensors(CONFIG, chain, rng))
    reply_after = chain.index(no_thinking_last) + 1
    reply_info = {
        "trigger_token_id": trigger,
        "reply_token_ids": reply,
        "reply_text": text,
        "reasoning": REASONING,
        "tool_call_id": "functions.get_weather:0",
        "tool_name": "get_weather",
        "arguments": ARGUMENTS,
        "no_thinking_trigger_token_id": no_thinking_last,
        "no_thinking_reply_token_ids": chain[chain.index(no_thinking_last) + 1:],
    }
    lines = [f" {json.dumps(k)}: {json.dumps(v)}" for k, v in reply_info.items()]
    (OUT_DIR / "scripted_reply.json").write_text("{\n" + ",\n".join(lines) + "\n}\n")
    size = sum(f.stat().st_size for f in OUT_DIR.iterdir())
    print(f"wrote {OUT_DIR.relative_to(ROOT)} ({size} bytes): {len(reply)} reply tokens "
          f"after trigger {trigger}: {reply}")


if __name__ == "__main__":
    main()

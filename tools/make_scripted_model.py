"""A scripted kimi_k3 checkpoint in the PUBLISHED Kimi K3.1 Pro layout: greedy decoding after the
chat prompt emits one fixed reply.

Writes tests/fixtures/scripted-kimi-k3/ (about 390 KB): config.json (nested text_config +
vision_config, as shared/configs/kimi-k3.1-pro-published.json), model.safetensors (tensors under
"language_model.", dtypes as shared/K3.md 4.2, routed experts compressed-tensors MXFP4, a vision
stub the engine must skip), the tokenizer and chat template of models/tiny-kimi-k3 (copied byte
for byte: same 1,024-token vocabulary) and scripted_reply.json (the reply's token ids, for the
server tests).

The reply (SCRIPT below) is a reasoning sentence closed by </think>, one Kimi tool call
(functions.get_weather:0 with {"city": "Paris"}) and <|im_end|>, the tokenizer's EOS.
The chat template's generation prompt ends with <think>, so the reasoning needs no opening
marker; the script renders the template to find that last prompt token (the "trigger").

Construction. The model is a successor table: token t -> f(t). With Block AttnRes (K3.md 3.2,
attn_res_block_size 1) every sublayer output is exactly 0:

    layer 0: bank = [embed(t)], prefix = attn(...) = 0, + mlp(...) = 0
             (o_proj weights are zero; dense down_proj, routed_expert_up_proj and the shared
             experts' down_proj are zero)
    layer 1: bank = [embed(t), 0], prefix = 0 again
    final:   AttnRes over [embed(t), 0, 0] = alpha_0 * embed(t)  (a zero candidate has key 0,
             score 0), then model.norm, then lm_head

  - chain = [trigger, reply token 0, reply token 1, ..., <|im_end|>]; f maps each chain
    token to the next one. f depends on the current token only, so every token of the chain
    occurs once in it: the reply is cut into vocabulary tokens with no id repeated (a search
    over segmentations; special markers by id) and the script asserts that the ids decode
    to exactly SCRIPT.
  - The k-th chain token with a successor (all but <|im_end|>) has embed row e_k (one-hot,
    value 1; hidden_size >= their number). After the final AttnRes and RMSNorm (weights 1) the
    stream is e_k * sqrt(D) / sqrt(1 + D * eps / alpha_0^2): the RMSNorm is scale-invariant up
    to eps, about 7.9 * e_k for D = 64 and the alpha_0 of this seed.
  - lm_head row f(t) = LOGIT_SCALE * e_k, so the successor's logit is about 63 and every
    other logit is exactly 0. All other embed and lm_head rows are zero.
  - Attention, KDA, indexer, AttnRes queries and MoE internals (router, latent down-projection,
    MXFP4 experts, latent norm input) hold small seeded random values (norm weights 1, biases 0),
    so the engine runs every path on non-trivial numbers; the zero output projections make their
    contribution exactly 0 whatever those numbers are.

So greedy decoding follows f from the prompt's last token, whatever came before it. The
template with chat_template_kwargs.thinking=false ends the prompt with </think>, which is in
the chain too: the reply is then the tool call without reasoning. After writing, the script runs
tools/k3_reference.py on the folder and asserts that greedy decoding after both rendered prompts
gives exactly the scripted replies.

Deterministic (fixed seed, bf16 rounded to nearest even, sorted tensor names): a re-run
reproduces every byte.
Usage: /work/venv-k3/bin/python tools/make_scripted_model.py   (numpy, safetensors, jinja2)
"""

import base64
import copy
import json
import shutil
import sys
from pathlib import Path

import jinja2
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))

import k3_reference  # noqa: E402
from make_k3_fixtures import (  # noqa: E402
    K31_PRO_TINY, QUANTIZATION_CONFIG, VISION_STUB, encode_tensors, write_safetensors)

SOURCE_DIR = ROOT / "models" / "tiny-kimi-k3"
OUT_DIR = ROOT / "tests" / "fixtures" / "scripted-kimi-k3"
COPIED_FILES = ["tiktoken.model", "tokenizer_config.json"]

SEED = 20261130
LOGIT_SCALE = 8.0
INTERNAL_STD = 0.1  # random internals (never reach the residual stream)
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


# Published layout (K3.md 1): a KDA layer with the dense SiTU MLP, then an MLA + DSA layer with the
# latent MoE. Token ids: Kimi's specials at 768 + offset (bos <|im_begin|>-like 768, eos <|im_end|>).
TEXT_CONFIG = {
    "_name_or_path": "",
    "activation_situ_beta": 4.0,
    "activation_situ_linear_beta": 25.0,
    "architectures": ["KimiLinearForCausalLM"],
    "attn_res_block_size": 1,
    "bos_token_id": 768,
    "dsa_config": {"index_head_dim": 32, "index_n_heads": 2, "index_topk": 8, "layers": [2]},
    "dtype": "bfloat16",
    "eos_token_id": 770,
    "first_k_dense_replace": 1,
    "hidden_act": "situ",
    "hidden_size": 64,
    "initializer_range": 0.02,
    "intermediate_size": 32,
    "kv_lora_rank": 16,
    "latent_moe_use_norm": True,
    "linear_attn_config": {
        "full_attn_layers": [2],
        "gate_lower_bound": -5.0,
        "head_dim": 16,
        "kda_layers": [1],
        "num_heads": 2,
        "short_conv_kernel_size": 4,
        "use_full_rank_gate": True,
    },
    "max_position_embeddings": 4096,
    "mla_use_nope": True,
    "mla_use_output_gate": True,
    "model_type": "kimi_linear",
    "moe_intermediate_size": 32,
    "moe_layer_freq": 1,
    "moe_renormalize": True,
    "moe_router_activation_func": "sigmoid",
    "num_attention_heads": 2,
    "num_expert_group": 1,
    "num_experts": 4,
    "num_experts_per_token": 2,
    "num_hidden_layers": 2,
    "num_key_value_heads": 2,
    "num_nextn_predict_layers": 0,
    "num_shared_experts": 1,
    "pad_token_id": 0,
    "q_lora_rank": 16,
    "qk_nope_head_dim": 8,
    "qk_rope_head_dim": 8,
    "quantization_config": QUANTIZATION_CONFIG,
    "rms_norm_eps": 1e-05,
    "routed_expert_hidden_size": 32,
    "routed_scaling_factor": 2.5,
    "tie_word_embeddings": False,
    "topk_group": 1,
    "topk_method": "noaux_tc",
    "transformers_version": "4.56.2",
    "use_cache": True,
    "use_grouped_topk": True,
    "v_head_dim": 8,
    "vocab_size": 1024,
}
CONFIG = {
    "architectures": ["KimiK31ForConditionalGeneration"],
    "bos_token_id": 768,
    "dtype": "bfloat16",
    "eos_token_id": 770,
    "media_placeholder_token_id": 789,  # 768 + 21, as the real 163605 = 163584 + 21; not in the chain
    "model_type": "kimi_k3",
    "pad_token_id": 0,
    "text_config": TEXT_CONFIG,
    "tie_word_embeddings": False,
    "vision_config": copy.deepcopy(K31_PRO_TINY["vision_config"]),
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

    def encode_longest_match(self, text):
        """Ids for text: special names by id, else the longest base token at each position.
        Not the tokenizer's BPE: only a plausible prompt for the reference check in main()."""
        data, ids, pos = text.encode(), [], 0
        specials = sorted(((n.encode(), i) for n, i in self.special_ids.items()), key=lambda s: -len(s[0]))
        while pos < len(data):
            for name, token_id in specials:
                if data.startswith(name, pos):
                    ids.append(token_id)
                    pos += len(name)
                    break
            else:
                for length in range(min(self.max_len, len(data) - pos), 0, -1):
                    token_id = self.base_ids.get(data[pos:pos + length])
                    if token_id is not None:
                        ids.append(token_id)
                        pos += length
                        break
                else:
                    raise AssertionError(f"no token for byte {data[pos]}")
        return ids


def render_generation_prompt(thinking):
    """A rendered one-user-message chat prompt with the generation prompt appended."""
    config = json.loads((SOURCE_DIR / "tokenizer_config.json").read_text())
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
    kwargs = {} if thinking else {"thinking": False}
    return env.from_string(config["chat_template"]).render(
        messages=[{"role": "user", "content": "What is the weather in Paris?"}],
        add_generation_prompt=True, **kwargs)


def generation_prompt_last_token(vocab, thinking):
    """The last token of a rendered one-user-message chat prompt (a special token)."""
    text = render_generation_prompt(thinking)
    for name, token_id in vocab.special_ids.items():
        if text.endswith(name):
            return token_id
    raise AssertionError(f"the generation prompt does not end with a special token: {text!r}")


def build_tensors(config, chain, rng):
    """Logical float32 tensors (name -> array) and their storage (name -> BF16 / F32 / MXFP4),
    names as shared/configs/kimi-k3-published.tensors.txt plus the K3.1 Pro indexer."""
    c = config["text_config"]
    d = c["hidden_size"]
    t, storage = {}, {}

    def put(name, value, kind="BF16"):
        t["language_model." + name if not name.startswith(("vision_tower.", "mm_projector.")) else name] = \
            np.asarray(value, dtype=np.float32)
        storage[next(reversed(t))] = kind

    random = lambda *shape: rng.standard_normal(shape) * INTERNAL_STD
    zeros = lambda *shape: np.zeros(shape)
    ones = lambda *shape: np.ones(shape)

    embed, lm_head = zeros(c["vocab_size"], d), zeros(c["vocab_size"], d)
    assert len(chain) - 1 <= d, f"{len(chain) - 1} chain tokens need hidden_size >= that"
    for k, (token, successor) in enumerate(zip(chain, chain[1:])):
        embed[token, k] = 1.0
        lm_head[successor, k] = LOGIT_SCALE
    put("model.embed_tokens.weight", embed)
    put("lm_head.weight", lm_head)
    put("model.norm.weight", ones(d))
    put("model.output_attn_res_norm.weight", ones(d))
    put("model.output_attn_res_proj.weight", random(1, d))

    lin, dsa = c["linear_attn_config"], c["dsa_config"]
    h, dn, dr, dv = c["num_attention_heads"], c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"]
    q_lora, kv_lora = c["q_lora_rank"], c["kv_lora_rank"]
    hk, k_dim, kw = lin["num_heads"], lin["head_dim"], lin["short_conv_kernel_size"]
    hi, di = dsa["index_n_heads"], dsa["index_head_dim"]
    moe_w, latent = c["moe_intermediate_size"], c["routed_expert_hidden_size"]
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        for n in ("input_layernorm", "post_attention_layernorm", "self_attention_res_norm", "mlp_res_norm"):
            put(p + n + ".weight", ones(d))
        put(p + "self_attention_res_proj.weight", random(1, d))
        put(p + "mlp_res_proj.weight", random(1, d))
        a = p + "self_attn."
        if (i + 1) in lin["kda_layers"]:
            width = hk * k_dim
            for x in "qkv":
                put(a + f"{x}_proj.weight", random(width, d))
                put(a + f"{x}_conv1d.weight", random(width, 1, kw), "F32")
            put(a + "f_a_proj.weight", random(k_dim, d))
            put(a + "f_b_proj.weight", random(width, k_dim))
            put(a + "b_proj.weight", random(hk, d))
            a_log = zeros(k_dim)  # stored padded to head_dim; entries >= num_heads exactly 0
            a_log[:hk] = random(hk)
            put(a + "A_log", a_log, "F32")
            put(a + "dt_bias", random(width), "F32")
            put(a + "o_norm.weight", ones(k_dim), "F32")
            put(a + "g_proj.weight", random(width, d))  # full-rank output gate
            put(a + "o_proj.weight", zeros(d, width))
        else:
            put(a + "q_a_proj.weight", random(q_lora, d))
            put(a + "q_a_layernorm.weight", ones(q_lora))
            put(a + "q_b_proj.weight", random(h * (dn + dr), q_lora))
            put(a + "kv_a_proj_with_mqa.weight", random(kv_lora + dr, d))
            put(a + "kv_a_layernorm.weight", ones(kv_lora))
            put(a + "kv_b_proj.weight", random(h * (dn + dv), kv_lora))
            put(a + "g_proj.weight", random(h * dv, d))
            put(a + "o_proj.weight", zeros(d, h * dv))
            put(a + "indexer.wq_b.weight", random(hi * di, q_lora))
            put(a + "indexer.wk.weight", random(di, d))
            put(a + "indexer.k_norm.weight", ones(di))
            put(a + "indexer.k_norm.bias", zeros(di))
            put(a + "indexer.weights_proj.weight", random(hi, d))
        if i < c["first_k_dense_replace"]:
            m, width = p + "mlp.", c["intermediate_size"]
            put(m + "gate_proj.weight", random(width, d))
            put(m + "up_proj.weight", random(width, d))
            put(m + "down_proj.weight", zeros(d, width))
        else:
            m = p + "block_sparse_moe."
            put(m + "gate.weight", random(c["num_experts"], d))
            put(m + "gate.e_score_correction_bias", random(c["num_experts"]), "F32")
            put(m + "routed_expert_down_proj.weight", random(latent, d))
            put(m + "routed_expert_norm.weight", ones(latent))
            put(m + "routed_expert_up_proj.weight", zeros(d, latent))  # the routed path's zero
            for e in range(c["num_experts"]):
                put(m + f"experts.{e}.w1.weight", random(moe_w, latent), "MXFP4")
                put(m + f"experts.{e}.w3.weight", random(moe_w, latent), "MXFP4")
                put(m + f"experts.{e}.w2.weight", random(latent, moe_w), "MXFP4")
            shared_w = moe_w * c["num_shared_experts"]
            put(m + "shared_experts.gate_proj.weight", random(shared_w, d))
            put(m + "shared_experts.up_proj.weight", random(shared_w, d))
            put(m + "shared_experts.down_proj.weight", zeros(d, shared_w))
    for name, shape in sorted(VISION_STUB.items()):
        put(name, random(*shape))
    return t, storage


def check_with_reference(vocab, thinking, expected):
    """Greedy decoding with tools/k3_reference.py after the rendered prompt must give `expected`."""
    model = k3_reference.Model(str(OUT_DIR))
    seq = vocab.encode_longest_match(render_generation_prompt(thinking))
    out, min_gap = [], np.inf
    while len(out) < len(expected):
        logits = model.forward(seq)[-1]
        top2 = np.sort(logits)[-2:]
        min_gap = min(min_gap, top2[1] - top2[0])
        seq.append(int(np.argmax(logits)))
        out.append(seq[-1])
    assert out == expected, (out, expected)
    return min_gap


def main():
    vocab = Vocab(SOURCE_DIR)
    assert len(vocab.base) + 256 == TEXT_CONFIG["vocab_size"]
    assert TEXT_CONFIG["eos_token_id"] == vocab.special_ids["<|im_end|>"]

    trigger = generation_prompt_last_token(vocab, thinking=True)
    assert trigger == vocab.special_ids["<think>"], "expected the prompt to end with <think>"
    no_thinking_last = generation_prompt_last_token(vocab, thinking=False)

    reply = vocab.segment_without_repeats(SCRIPT)
    text = "".join(SCRIPT)
    assert vocab.decode(reply) == text, (vocab.decode(reply), text)
    chain = [trigger] + reply
    assert len(set(chain)) == len(chain), "a chain token repeats: f would not be a function"
    assert reply[-1] == TEXT_CONFIG["eos_token_id"]
    assert no_thinking_last in chain, "the thinking=false prompt must end on a chain token"
    assert CONFIG["media_placeholder_token_id"] not in chain

    OUT_DIR.mkdir(parents=True, exist_ok=True)
    for stale in sorted(OUT_DIR.glob("*.safetensors")) + sorted(OUT_DIR.glob("*.index.json")):
        stale.unlink()
    (OUT_DIR / "config.json").write_text(json.dumps(CONFIG, indent=2, sort_keys=True) + "\n")
    for name in COPIED_FILES:
        shutil.copyfile(SOURCE_DIR / name, OUT_DIR / name)
    rng = np.random.default_rng(SEED)
    tensors, storage = build_tensors(CONFIG, chain, rng)
    write_safetensors(OUT_DIR / "model.safetensors", encode_tensors(tensors, storage))
    no_thinking_reply = chain[chain.index(no_thinking_last) + 1:]
    reply_info = {
        "trigger_token_id": trigger,
        "reply_token_ids": reply,
        "reply_text": text,
        "reasoning": REASONING,
        "tool_call_id": "functions.get_weather:0",
        "tool_name": "get_weather",
        "arguments": ARGUMENTS,
        "no_thinking_trigger_token_id": no_thinking_last,
        "no_thinking_reply_token_ids": no_thinking_reply,
    }
    lines = [f" {json.dumps(k)}: {json.dumps(v)}" for k, v in reply_info.items()]
    (OUT_DIR / "scripted_reply.json").write_text("{\n" + ",\n".join(lines) + "\n}\n")

    gap = check_with_reference(vocab, True, reply)
    gap_nt = check_with_reference(vocab, False, no_thinking_reply)
    size = sum(f.stat().st_size for f in OUT_DIR.iterdir())
    print(f"wrote {OUT_DIR.relative_to(ROOT)} ({size} bytes): {len(reply)} reply tokens "
          f"after trigger {trigger}: {reply}")
    print(f"k3_reference greedy reply matches (thinking: min top1-top2 gap {gap:.3f}; "
          f"thinking=false: {gap_nt:.3f})")


if __name__ == "__main__":
    main()

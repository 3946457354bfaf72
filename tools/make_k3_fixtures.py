"""Builds the kimi_k3 fixtures in the PUBLISHED Kimi K3 / K3.1 Pro layout (shared/K3.md), with
goldens from tools/k3_reference.py. numpy + safetensors only; deterministic (fixed seeds, sorted
tensor names, bf16 rounded to nearest even): a re-run reproduces every file byte for byte.

  models/tiny-kimi-k3/                    bundled tiny K3.1 Pro (DSA indexer on the MLA layers):
                                          config.json + model.safetensors are written here;
                                          tiktoken.model and tokenizer_config.json are kept
                                          untouched; any other *.safetensors / index is removed.
                                          Golden -> tests/fixtures/kimi_k3_tiny/
  tests/fixtures/kimi_k3_published_tiny/  tiny K3 (no indexer), model SHARDED into two files plus
                                          model.safetensors.index.json, golden in the same folder.

Both models: nested "text_config" + "vision_config" config.json, tensors under "language_model."
(plus a vision tower / projector stub the engine must skip), dtypes as K3.md 4.2 (bf16; fp32 for
*_conv1d.weight, A_log, dt_bias, o_norm.weight, gate.e_score_correction_bias), routed experts as
compressed-tensors MXFP4 (weight_packed / weight_scale, group 32), A_log stored padded to
linear_attn_config.head_dim with the entries >= num_heads exactly 0 (as the real K3 stores [128]
for 96 heads).

Golden format (as tools/make_fixtures.py): golden.safetensors with, for i = 0, 1, 2 and
n = 5, 17, 40:
  prompt_<i>_ids I64 [n]            numpy.random.default_rng(1000 + i).integers(0, vocab_size, n)
  prompt_<i>_logits F32 [n, V]      prefill logits at every position
  prompt_<i>_greedy_ids I64 [32]    greedy continuation
  prompt_<i>_greedy_logits F32 [32, V]  row j = logits after prompt + greedy_ids[:j] (full recompute)
and meta.json (seed, per-prompt min top1-top2 gap, router / indexer margins, AttnRes alpha range).
A seed is accepted when every gap >= 1e-3 and both margins >= 1e-5; otherwise the next seed.

Usage: /work/venv-k3/bin/python tools/make_k3_fixtures.py   (from anywhere; about 5 seconds)
"""

import copy
import json
import math
import os
import struct
import sys

import numpy as np
import safetensors
from safetensors.numpy import save_file

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

import k3_reference as ref  # noqa: E402

PROMPT_LENGTHS = [5, 17, 40]
PROMPT_SEED_BASE = 1000
NUM_GREEDY = 32
MIN_GAP = 1e-3
MIN_MARGIN = 1e-5
MAX_ATTEMPTS = 20
ATTN_RES_PROJ_STD = 0.2  # AttnRes queries: median max-alpha about 0.7, so mixes are far from uniform and from one-hot

# ----------------------------------------------------------------------------------------------
# Configs

# text_config.quantization_config of the published K3 config.json, verbatim (K3.md 4.3).
QUANTIZATION_CONFIG = {
    "config_groups": {
        "group_0": {
            "format": "mxfp4-pack-quantized",
            "input_activations": None,
            "output_activations": None,
            "targets": ["Linear"],
            "weights": {
                "actorder": None, "block_structure": None, "dynamic": False, "group_size": 32,
                "num_bits": 4, "observer": "minmax", "observer_kwargs": {}, "scale_dtype": "torch.uint8",
                "strategy": "group", "symmetric": True, "type": "float", "zp_dtype": None,
            },
        }
    },
    "format": "mxfp4-pack-quantized",
    "global_compression_ratio": None,
    "ignore": [
        "re:.*self_attn.*",
        "re:.*shared_experts.*",
        "re:.*mlp\\.(gate|up|gate_up|down)_proj.*",
        "re:.*lm_head.*",
        "re:.*vision_tower.*",
        "re:.*mm_projector.*",
    ],
    "kv_cache_scheme": None,
    "quant_method": "compressed-tensors",
    "quantization_status": "compressed",
}

# A tiny K3.1 Pro: 7 layers, KDA at 0-based 0,1,2,4 and MLA+DSA at 3,5,6 (the last two both MLA),
# AttnRes snapshots at layers 0, 2, 4, 6.
K31_PRO_TINY = {
    "architectures": ["KimiK31ForConditionalGeneration"],
    "auto_map": {
        "AutoConfig": "configuration_kimi_k3.KimiK3Config",
        "AutoModel": "modeling_kimi_k3.KimiK3ForConditionalGeneration",
        "AutoModelForCausalLM": "modeling_kimi_k3.KimiK3ForConditionalGeneration",
    },
    "bos_token_id": 1,
    "dtype": "bfloat16",
    "eos_token_id": 2,
    "ignore_index": -100,
    "image_placeholder": "<|kimi_image_placeholder|>",
    "media_placeholder_token_id": 3,
    "model_type": "kimi_k3",
    "pad_token_id": 0,
    "text_config": {
        "_name_or_path": "",
        "activation_situ_beta": 4.0,
        "activation_situ_linear_beta": 25.0,
        "architectures": ["KimiLinearForCausalLM"],
        "attn_res_block_size": 2,
        "auto_map": {
            "AutoConfig": "configuration_kimi_k3.KimiLinearConfig",
            "AutoModel": "modeling_kimi_linear.KimiLinearModel",
            "AutoModelForCausalLM": "modeling_kimi_linear.KimiLinearForCausalLM",
        },
        "bos_token_id": 1,
        "do_sample": False,
        "dsa_config": {"index_head_dim": 32, "index_n_heads": 4, "index_topk": 8, "layers": [4, 6, 7]},
        "dtype": "bfloat16",
        "eos_token_id": 2,
        "first_k_dense_replace": 1,
        "hidden_act": "situ",
        "hidden_size": 64,
        "id2label": {"0": "LABEL_0", "1": "LABEL_1"},
        "initializer_range": 0.02,
        "intermediate_size": 128,
        "is_encoder_decoder": False,
        "kv_lora_rank": 32,
        "label2id": {"LABEL_0": 0, "LABEL_1": 1},
        "latent_moe_use_norm": True,
        "linear_attn_config": {
            "full_attn_layers": [4, 6, 7],
            "gate_lower_bound": -5.0,
            "head_dim": 32,
            "kda_layers": [1, 2, 3, 5],
            "num_heads": 2,
            "short_conv_kernel_size": 4,
            "use_full_rank_gate": True,
        },
        "max_length": 20,
        "max_position_embeddings": 4096,
        "mla_use_nope": True,
        "mla_use_output_gate": True,
        "model_type": "kimi_linear",
        "moe_intermediate_size": 32,
        "moe_layer_freq": 1,
        "moe_renormalize": True,
        "moe_router_activation_func": "sigmoid",
        "num_attention_heads": 4,
        "num_beams": 1,
        "num_expert_group": 1,
        "num_experts": 8,
        "num_experts_per_token": 2,
        "num_hidden_layers": 7,
        "num_key_value_heads": 4,
        "num_nextn_predict_layers": 0,
        "num_shared_experts": 2,
        "output_attentions": False,
        "pad_token_id": 0,
        "q_lora_rank": 32,
        "qk_nope_head_dim": 16,
        "qk_rope_head_dim": 8,
        "quantization_config": QUANTIZATION_CONFIG,
        "return_dict": True,
        "rms_norm_eps": 1e-05,
        "routed_expert_hidden_size": 32,
        "routed_scaling_factor": 1.0,
        "temperature": 1.0,
        "tie_word_embeddings": False,
        "top_k": 50,
        "top_p": 1.0,
        "topk_group": 1,
        "topk_method": "noaux_tc",
        "torchscript": False,
        "transformers_version": "4.56.2",
        "use_bfloat16": False,
        "use_cache": True,
        "use_grouped_topk": True,
        "v_head_dim": 16,
        "vocab_size": 1024,
    },
    "tie_word_embeddings": False,
    # A tiny MoonViT-3d + patchmergerv2 description; the stub tensors below match it.
    "vision_config": {
        "_attn_implementation": "flash_attention_2",
        "activation_func": "gelu_pytorch_tanh",
        "attn_bias": False,
        "init_pos_emb_height": 4,
        "init_pos_emb_time": 4,
        "init_pos_emb_width": 4,
        "linear_bias": False,
        "merge_kernel_size": [2, 2],
        "merge_type": "sd2_tpool",
        "mlp_type": "mlp2",
        "mm_hidden_size": 16,
        "mm_projector_type": "patchmergerv2",
        "norm_type": "rmsnorm",
        "patch_embed_proj_bias": False,
        "patch_size": 14,
        "pos_emb_interpolation_mode": "bilinear",
        "pos_emb_type": "divided_fixed",
        "projector_hidden_act": "gelu",
        "projector_ln_eps": 1e-05,
        "qkv_hidden_size": 16,
        "text_hidden_size": 64,
        "vt_hidden_size": 16,
        "vt_intermediate_size": 32,
        "vt_num_attention_heads": 1,
        "vt_num_hidden_layers": 1,
    },
}


def k3_tiny_config():
    """The tiny K3 (no indexer): as K31_PRO_TINY but KimiK3ForConditionalGeneration, no dsa_config,
    3 KDA heads (A_log stored [32], entries 3.. zero) and AttnRes blocks of 3 (snapshots 0, 3, 6)."""
    c = copy.deepcopy(K31_PRO_TINY)
    c["architectures"] = ["KimiK3ForConditionalGeneration"]
    t = c["text_config"]
    del t["dsa_config"]
    t["linear_attn_config"]["num_heads"] = 3
    t["attn_res_block_size"] = 3
    return c


# Vision tower / projector stub (K3.md 8): present in the file, never read by a text-only engine.
VISION_STUB = {
    "vision_tower.patch_embed.proj.weight": [16, 3, 14, 14],
    "vision_tower.encoder.blocks.0.wqkv.weight": [48, 16],
    "mm_projector.proj.0.weight": [64, 64],
    "mm_projector.proj.2.weight": [64, 64],
    "mm_projector.post_norm.weight": [64],
}

FP32_SUFFIXES = ("_conv1d.weight", "A_log", "dt_bias", "o_norm.weight", "gate.e_score_correction_bias")


def tensor_specs(config):
    """Logical tensors of the published layout: full name -> (shape, storage), storage in
    "BF16", "F32" or "MXFP4" (stored as <p>.weight_packed + <p>.weight_scale). Names and shapes as
    shared/configs/kimi-k3-published.tensors.txt (+ the K3.1 Pro indexer)."""
    c = config["text_config"]
    lin, dsa = c["linear_attn_config"], c.get("dsa_config")
    D, V = c["hidden_size"], c["vocab_size"]
    H, dn, dr, dv = c["num_attention_heads"], c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"]
    qr, kr = c["q_lora_rank"], c["kv_lora_rank"]
    Hk, K, ck = lin["num_heads"], lin["head_dim"], lin["short_conv_kernel_size"]
    E, I, L = c["num_experts"], c["moe_intermediate_size"], c["routed_expert_hidden_size"]
    Id, Is = c["intermediate_size"], c["moe_intermediate_size"] * c["num_shared_experts"]
    shapes = {
        "language_model.model.embed_tokens.weight": [V, D],
        "language_model.lm_head.weight": [V, D],
        "language_model.model.norm.weight": [D],
        "language_model.model.output_attn_res_norm.weight": [D],
        "language_model.model.output_attn_res_proj.weight": [1, D],
    }
    for i in range(c["num_hidden_layers"]):
        p = f"language_model.model.layers.{i}."
        for n in ("input_layernorm", "post_attention_layernorm", "self_attention_res_norm", "mlp_res_norm"):
            shapes[p + n + ".weight"] = [D]
        shapes[p + "self_attention_res_proj.weight"] = [1, D]  # also on layer 0, never read there
        shapes[p + "mlp_res_proj.weight"] = [1, D]
        a = p + "self_attn."
        if (i + 1) in lin["kda_layers"]:
            P = Hk * K
            for n in "qkv":
                shapes[a + f"{n}_proj.weight"] = [P, D]
                shapes[a + f"{n}_conv1d.weight"] = [P, 1, ck]
            shapes.update({
                a + "f_a_proj.weight": [K, D], a + "f_b_proj.weight": [P, K], a + "b_proj.weight": [Hk, D],
                a + "A_log": [K], a + "dt_bias": [P], a + "o_norm.weight": [K],
                a + "g_proj.weight": [P, D], a + "o_proj.weight": [D, P],
            })
        else:
            shapes.update({
                a + "q_a_proj.weight": [qr, D], a + "q_a_layernorm.weight": [qr],
                a + "q_b_proj.weight": [H * (dn + dr), qr], a + "kv_a_proj_with_mqa.weight": [kr + dr, D],
                a + "kv_a_layernorm.weight": [kr], a + "kv_b_proj.weight": [H * (dn + dv), kr],
                a + "g_proj.weight": [H * dv, D], a + "o_proj.weight": [D, H * dv],
            })
            if dsa is not None:
                Hi, di = dsa["index_n_heads"], dsa["index_head_dim"]
                shapes.update({
                    a + "indexer.wq_b.weight": [Hi * di, qr], a + "indexer.wk.weight": [di, D],
                    a + "indexer.k_norm.weight": [di], a + "indexer.k_norm.bias": [di],
                    a + "indexer.weights_proj.weight": [Hi, D],
                })
        if i < c["first_k_dense_replace"]:
            m = p + "mlp."
            shapes.update({m + "gate_proj.weight": [Id, D], m + "up_proj.weight": [Id, D], m + "down_proj.weight": [D, Id]})
        else:
            m = p + "block_sparse_moe."
            shapes.update({
                m + "gate.weight": [E, D], m + "gate.e_score_correction_bias": [E],
                m + "routed_expert_down_proj.weight": [L, D], m + "routed_expert_norm.weight": [L],
                m + "routed_expert_up_proj.weight": [D, L],
                m + "shared_experts.gate_proj.weight": [Is, D], m + "shared_experts.up_proj.weight": [Is, D],
                m + "shared_experts.down_proj.weight": [D, Is],
            })
            for e in range(E):
                shapes.update({m + f"experts.{e}.w1.weight": [I, L], m + f"experts.{e}.w3.weight": [I, L],
                               m + f"experts.{e}.w2.weight": [L, I]})
    shapes.update(VISION_STUB)
    specs = {}
    for name, shape in shapes.items():
        if ".experts." in name:
            storage = "MXFP4"
        elif name.endswith(FP32_SUFFIXES):
            storage = "F32"
        else:
            storage = "BF16"
        specs[name] = (shape, storage)
    return specs


# ----------------------------------------------------------------------------------------------
# Deterministic initialization (by tensor name, in sorted order, from one seeded generator)


def init_tensor(name, shape, rng, num_kda_heads):
    """float32 values; scales chosen so that logits are well spread (top1-top2 gaps far above
    fp32 noise) and every path contributes."""

    def normal(std):
        return rng.standard_normal(shape) * std

    def uniform(a, b):
        return rng.uniform(a, b, shape)

    if "embed_tokens" in name:
        v = normal(1.0)
    elif name.endswith("A_log"):
        # Stored padded to head_dim: only the first num_heads entries are real, the rest exactly 0.
        v = np.zeros(shape)
        v[:num_kda_heads] = np.log(rng.uniform(0.5, 2.0, num_kda_heads))
    elif name.endswith("dt_bias"):
        v = uniform(-2.0, 0.0)  # bounded gate: -5 sigmoid(exp(A_log) (f + dt_bias)) spans (-5, 0)
    elif name.endswith("e_score_correction_bias"):
        v = normal(0.05)
    elif name.endswith(".bias"):
        v = normal(0.1)
    elif name.endswith("_res_proj.weight"):  # AttnRes query [1, D]
        v = normal(ATTN_RES_PROJ_STD)
    elif len(shape) == 1:  # norm weights
        v = 1.0 + normal(0.1)
    elif "conv1d" in name:
        v = normal(0.5)
    elif "lm_head" in name:
        v = normal(4.0 / math.sqrt(shape[-1]))
    elif name.endswith("block_sparse_moe.gate.weight"):  # router
        v = normal(2.0 / math.sqrt(shape[-1]))
    else:
        v = normal(1.0 / math.sqrt(shape[-1]))
    return np.asarray(v, dtype=np.float32)


# ----------------------------------------------------------------------------------------------
# Storage: bf16, MXFP4 and a tiny safetensors writer (numpy has no bf16)


def bf16_bits(values):
    """float32 -> bf16 bit patterns (uint16), round to nearest even on the bit pattern."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)


def e2m1_codes(x):
    """Round to the nearest e2m1 value (ties to the even code); 4-bit codes, bit 3 = sign."""
    mags = np.array(ref.E2M1_MAGNITUDES)
    dist = np.abs(np.abs(x)[..., None] - mags)
    code = dist.argmin(-1)  # first (lower) code on ties
    best = np.take_along_axis(dist, code[..., None], -1)[..., 0]
    nxt = np.take_along_axis(dist, np.minimum(code + 1, 7)[..., None], -1)[..., 0]
    code = np.where((code % 2 == 1) & (code < 7) & (nxt == best), code + 1, code)  # tie: even code
    sign = ((x < 0) & (code != 0)).astype(np.int64) << 3
    return code | sign


def quantize_mxfp4(w):
    """w float32 [out, in] -> (weight_packed U8 [out, in/2], weight_scale U8 [out, in/32]), as
    make_fixtures.py's quantize_mxfp4: scale exponent ceil(log2(amax / 6)), RNE to e2m1."""
    rows, cols = w.shape
    assert cols % 32 == 0
    blocks = w.reshape(rows, cols // 32, 32)
    amax = np.abs(blocks).max(-1)
    with np.errstate(divide="ignore"):
        exp = np.clip(np.ceil(np.log2(amax.astype(np.float64) / 6.0)), -127, 127)
    exp = np.where(amax > 0, exp, -127.0)
    scale = (exp + 127).astype(np.uint8)
    codes = e2m1_codes(blocks / np.exp2(exp).astype(np.float32)[..., None]).reshape(rows, cols)
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).astype(np.uint8)
    return packed, scale


def encode_tensors(values, storage):
    """Logical float32 tensors -> stored tensors: name -> (safetensors dtype, numpy array)."""
    out = {}
    for name in sorted(values):
        v = values[name]
        if storage[name] == "MXFP4":
            packed, scale = quantize_mxfp4(v)
            prefix = name[: -len(".weight")]
            out[prefix + ".weight_packed"] = ("U8", packed)
            out[prefix + ".weight_scale"] = ("U8", scale)
        elif storage[name] == "F32":
            out[name] = ("F32", v.astype("<f4"))
        else:
            out[name] = ("BF16", bf16_bits(v))
    return out


def write_safetensors(path, tensors):
    """tensors: name -> (dtype in BF16/F32/U8/I64, array of matching bytes); sorted names;
    header = 8-byte little-endian length + JSON (padded with spaces to 8 bytes)."""
    header, chunks, offset = {"__metadata__": {"format": "pt"}}, [], 0
    little = {"BF16": "<u2", "F32": "<f4", "U8": "u1", "I64": "<i8"}
    for name in sorted(tensors):
        dtype, array = tensors[name]
        data = np.ascontiguousarray(array, dtype=little[dtype]).tobytes()
        header[name] = {"dtype": dtype, "shape": list(array.shape), "data_offsets": [offset, offset + len(data)]}
        chunks.append(data)
        offset += len(data)
    header_bytes = json.dumps(header, separators=(",", ":")).encode()
    header_bytes += b" " * (-len(header_bytes) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(header_bytes)))
        f.write(header_bytes)
        for chunk in chunks:
            f.write(chunk)
    # The official parser must accept the file and see the same names, dtypes and shapes.
    with safetensors.safe_open(path, "numpy") as f:
        assert set(f.keys()) == set(tensors)
        for name in f.keys():
            s = f.get_slice(name)
            assert s.get_shape() == list(tensors[name][1].shape), name
            assert s.get_dtype() == tensors[name][0], name


def write_json(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f, indent=2, sort_keys=True)
        f.write("\n")


def remove_checkpoint_files(folder):
    for name in sorted(os.listdir(folder)):
        if name.endswith(".safetensors") and name != "golden.safetensors" or name == "model.safetensors.index.json":
            os.remove(os.path.join(folder, name))


def build_model(config, seed, folder, shards=1):
    """Writes config.json and the weights (model.safetensors, or `shards` files + index) into
    folder, after removing stale checkpoint files; other files in folder are left alone."""
    specs = tensor_specs(config)
    rng = np.random.default_rng(seed)
    heads = config["text_config"]["linear_attn_config"]["num_heads"]
    values = {name: init_tensor(name, specs[name][0], rng, heads) for name in sorted(specs)}
    stored = encode_tensors(values, {n: s for n, (_, s) in specs.items()})
    os.makedirs(folder, exist_ok=True)
    remove_checkpoint_files(folder)
    write_json(os.path.join(folder, "config.json"), config)
    if shards == 1:
        write_safetensors(os.path.join(folder, "model.safetensors"), stored)
        return
    # Split the sorted names into `shards` runs of roughly equal bytes, HF-style names and index.
    names = sorted(stored)
    sizes = [stored[n][1].nbytes for n in names]
    total, files, weight_map, start, acc = sum(sizes), [], {}, 0, 0
    for s in range(shards):
        end = start
        while end < len(names) and (s == shards - 1 or acc + sizes[end] <= total * (s + 1) / shards):
            acc += sizes[end]
            end += 1
        file = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        write_safetensors(os.path.join(folder, file), {n: stored[n] for n in names[start:end]})
        weight_map.update({n: file for n in names[start:end]})
        start = end
    assert start == len(names)
    write_json(os.path.join(folder, "model.safetensors.index.json"),
               {"metadata": {"total_size": total}, "weight_map": weight_map})


# ----------------------------------------------------------------------------------------------
# Goldens


def make_prompts(vocab):
    return [np.random.default_rng(PROMPT_SEED_BASE + i).integers(0, vocab, n, dtype=np.int64)
            for i, n in enumerate(PROMPT_LENGTHS)]


def compute_goldens(model, prompts):
    """Full recompute at every greedy step; logits stored as float32."""
    tensors, gaps = {}, []
    for i, ids in enumerate(prompts):
        tensors[f"prompt_{i}_ids"] = ids.copy()
        tensors[f"prompt_{i}_logits"] = model.forward(ids).astype(np.float32)
        seq, greedy, rows, min_gap = list(ids), [], [], math.inf
        for _ in range(NUM_GREEDY):
            last = model.forward(seq)[-1]
            top2 = np.sort(last)[-2:]
            min_gap = min(min_gap, float(top2[1] - top2[0]))
            token = int(np.argmax(last))
            greedy.append(token)
            rows.append(last.astype(np.float32))
            seq.append(token)
        tensors[f"prompt_{i}_greedy_ids"] = np.array(greedy, dtype=np.int64)
        tensors[f"prompt_{i}_greedy_logits"] = np.stack(rows)
        gaps.append(min_gap)
    return tensors, gaps


def accept(gaps, stats):
    return min(gaps) >= MIN_GAP and stats["min_router_margin"] >= MIN_MARGIN and stats["min_indexer_rel_margin"] >= MIN_MARGIN


def write_golden(out_dir, golden, meta, readme):
    os.makedirs(out_dir, exist_ok=True)
    save_file(golden, os.path.join(out_dir, "golden.safetensors"))
    os.chmod(os.path.join(out_dir, "golden.safetensors"), 0o644)  # save_file creates it 0600
    meta = {k: (None if isinstance(v, float) and math.isinf(v) else v) for k, v in meta.items()}
    with open(os.path.join(out_dir, "meta.json"), "w") as f:
        json.dump(meta, f, indent=1, sort_keys=True, allow_nan=False)
        f.write("\n")
    with open(os.path.join(out_dir, "README.md"), "w") as f:
        f.write(readme)


def make_fixture(label, config, model_dir, out_dir, base_seed, shards, readme):
    prompts = make_prompts(config["text_config"]["vocab_size"])
    for attempt in range(MAX_ATTEMPTS):
        seed = base_seed + attempt
        build_model(config, seed, model_dir, shards)
        model = ref.Model(model_dir)
        golden, gaps = compute_goldens(model, prompts)
        stats = model.stats.to_dict()
        print(f"{label} seed {seed}: gaps {[f'{g:.4g}' for g in gaps]} stats {stats}")
        if accept(gaps, stats):
            break
    else:
        raise RuntimeError(f"{label}: no acceptable seed")
    meta = {"model": os.path.relpath(model_dir, ROOT), "source": "tools/k3_reference.py (float64)",
            "seed": seed, "prompt_ids": "numpy.random.default_rng(1000 + i).integers(0, vocab_size, n)",
            "prompt_min_top1_top2_gap": gaps, **stats}
    write_golden(out_dir, golden, meta, readme)
    print(f"{label}: prompt_0_greedy_ids {golden['prompt_0_greedy_ids'].tolist()}")


def main():
    make_fixture(
        "kimi_k3_tiny (K3.1 Pro)", K31_PRO_TINY, os.path.join(ROOT, "models", "tiny-kimi-k3"),
        os.path.join(ROOT, "tests", "fixtures", "kimi_k3_tiny"), 3000, 1,
        "Golden logits of the bundled model models/tiny-kimi-k3: a tiny Kimi K3.1 Pro in the published\n"
        "layout (7 layers, DSA indexer on the MLA layers 3, 5, 6), computed by tools/k3_reference.py in\n"
        "float64. Written by tools/make_k3_fixtures.py; see tools/README.md for the format.\n")
    folder = os.path.join(ROOT, "tests", "fixtures", "kimi_k3_published_tiny")
    make_fixture(
        "kimi_k3_published_tiny (K3)", k3_tiny_config(), folder, folder, 3100, 2,
        "A tiny Kimi K3 (no indexer) in the published layout, sharded into two safetensors files with\n"
        "model.safetensors.index.json, and its golden (golden.safetensors, meta.json) computed by\n"
        "tools/k3_reference.py in float64. Written by tools/make_k3_fixtures.py; see tools/README.md.\n")


if __name__ == "__main__":
    main()

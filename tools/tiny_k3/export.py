"""The published kimi_k3 checkpoint layout for tools/tiny_k3/model.py (issue 50): config, export, load.

    make_config(**dims)            -> published config.json dict (K3.1 Pro: nested text_config,
                                      dsa_config, compressed-tensors MXFP4 quantization_config),
                                      the template being make_k3_fixtures.K31_PRO_TINY
    export_checkpoint(model, dir)  -> config.json + model.safetensors exactly as
                                      tools/make_k3_fixtures.py writes them (`language_model.` names,
                                      BF16, F32 for *_conv1d / A_log / dt_bias / o_norm /
                                      e_score_correction_bias, routed experts as weight_packed +
                                      weight_scale, a vision stub), plus the tokenizer files
    load_checkpoint(model, dir)    <- the stored values back into the torch model (via
                                      k3_reference.load_text_weights, so MXFP4 is decoded by the
                                      reference's decoder)

The routed experts are packed from model.mxfp4_quantize (the fake-quant rounding of training);
tools/tiny_k3/check_export.py checks that these bytes equal make_k3_fixtures.quantize_mxfp4's.
"""

import copy
import json
import os
import shutil
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
TOOLS = os.path.dirname(HERE)
ROOT = os.path.dirname(TOOLS)
sys.path.insert(0, TOOLS)
sys.path.insert(0, HERE)

import k3_reference as ref  # noqa: E402
import make_k3_fixtures as fx  # noqa: E402
from model import mxfp4_dequantize, mxfp4_quantize  # noqa: E402

TOKENIZER_DIR = os.path.join(ROOT, "models", "tiny-k3-speaks")
TOKENIZER_FILES = ("tiktoken.model", "tokenizer_config.json")
PREFIX = "language_model."


def make_config(hidden=256, layers=8, mla_layers=(3, 6, 7), attn_res_block=2, vocab=4352,
                kda_heads=4, kda_dim=64, mla_heads=4, q_lora=128, kv_lora=128, dn=32, dr=16, dv=32,
                index_heads=4, index_dim=32, index_topk=512, intermediate=768, experts=16, top_k=4,
                moe_inter=64, latent=128, shared=2, max_positions=4096, special_base=4096):
    """A K3.1 Pro config in the published layout. mla_layers are 0-based (MLA + DSA); the rest KDA.
    special_base: id of [BOS] (Kimi's reserved specials follow: <|im_end|> = base + 2 is eos,
    [PAD] = base + 255, media placeholder = base + 21); for a vocabulary without them, ids 1, 2, 0, 3."""
    c = copy.deepcopy(fx.K31_PRO_TINY)
    t = c["text_config"]
    full = [i + 1 for i in mla_layers]
    kda = [i + 1 for i in range(layers) if i not in mla_layers]
    if special_base is None:
        bos, eos, pad, media = 1, 2, 0, 3
    else:
        bos, eos, pad, media = special_base, special_base + 2, special_base + 255, special_base + 21
    c.update(bos_token_id=bos, eos_token_id=eos, pad_token_id=pad, media_placeholder_token_id=media)
    t.update(
        bos_token_id=bos, eos_token_id=eos, pad_token_id=pad, attn_res_block_size=attn_res_block,
        dsa_config={"index_head_dim": index_dim, "index_n_heads": index_heads, "index_topk": index_topk,
                    "layers": full},
        hidden_size=hidden, intermediate_size=intermediate, kv_lora_rank=kv_lora,
        max_position_embeddings=max_positions, moe_intermediate_size=moe_inter,
        num_attention_heads=mla_heads, num_key_value_heads=mla_heads, num_experts=experts,
        num_experts_per_token=top_k, num_hidden_layers=layers, num_shared_experts=shared,
        q_lora_rank=q_lora, qk_nope_head_dim=dn, qk_rope_head_dim=dr, routed_expert_hidden_size=latent,
        v_head_dim=dv, vocab_size=vocab)
    t["linear_attn_config"].update(full_attn_layers=full, kda_layers=kda, num_heads=kda_heads, head_dim=kda_dim)
    c["vision_config"]["text_hidden_size"] = hidden
    return c


def logical_tensors(model):
    """Full published name -> float32 numpy array (experts unstacked), for every spec tensor."""
    specs = fx.tensor_specs(model.config)
    state = {k: v.detach().to("cpu", torch.float32) for k, v in model.state_dict().items()}
    out = {}
    for name, (shape, _) in specs.items():
        if not name.startswith(PREFIX):
            out[name] = np.zeros(shape, dtype=np.float32)  # vision stub, never read
            continue
        key = name[len(PREFIX):]
        if ".experts." in key:
            moe, rest = key.split(".experts.")
            e, w = rest.split(".")[:2]
            value = state[f"{moe}.{w}"][int(e)]
        else:
            value = state[key]
        assert list(value.shape) == list(shape), (name, value.shape, shape)
        out[name] = value.numpy()
    unused = {k for k in state if not any(k in n for n in out)} - {
        k for k in state if k.endswith((".w1", ".w2", ".w3"))}
    assert not unused, f"parameters missing from the layout: {sorted(unused)}"
    return out, specs


def pack_mxfp4(weight):
    codes, exps = mxfp4_quantize(torch.from_numpy(weight))
    codes = codes.numpy()
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).astype(np.uint8)
    return packed, (exps.numpy() + 127).astype(np.uint8)


def export_checkpoint(model, folder, tokenizer_dir=TOKENIZER_DIR):
    """Writes config.json, model.safetensors (and the tokenizer files when tokenizer_dir is set)."""
    values, specs = logical_tensors(model)
    stored = {}
    for name in sorted(values):
        storage = specs[name][1]
        if storage == "MXFP4":
            packed, scale = pack_mxfp4(values[name])
            prefix = name[: -len(".weight")]
            stored[prefix + ".weight_packed"] = ("U8", packed)
            stored[prefix + ".weight_scale"] = ("U8", scale)
        elif storage == "F32":
            stored[name] = ("F32", values[name].astype("<f4"))
        else:
            stored[name] = ("BF16", fx.bf16_bits(values[name]))
    os.makedirs(folder, exist_ok=True)
    fx.remove_checkpoint_files(folder)
    fx.write_json(os.path.join(folder, "config.json"), model.config)
    fx.write_safetensors(os.path.join(folder, "model.safetensors"), stored)
    if tokenizer_dir is not None:
        for f in TOKENIZER_FILES:
            shutil.copyfile(os.path.join(tokenizer_dir, f), os.path.join(folder, f))


def load_checkpoint(model, folder):
    """Loads the checkpoint's stored values (exactly decoded) into the torch model."""
    set_logical(model, ref.load_text_weights(folder))


def set_logical(model, weights):
    """weights: name without "language_model." -> array (experts as experts.<e>.w<n>.weight)."""
    state = model.state_dict()
    new = {}
    for key, value in state.items():
        if key.endswith((".w1", ".w2", ".w3")):
            moe, w = key.rsplit(".", 1)
            rows = [weights[f"{moe}.experts.{e}.{w}.weight"] for e in range(value.shape[0])]
            new[key] = torch.from_numpy(np.stack(rows))
        else:
            new[key] = torch.from_numpy(np.ascontiguousarray(weights[key])).reshape(value.shape)
    model.load_state_dict({k: v.to(state[k].dtype) for k, v in new.items()})


def round_to_checkpoint_(model):
    """In place: every parameter to the value the export stores (bf16 RNE, F32 unchanged, MXFP4)."""
    specs = fx.tensor_specs(model.config)
    storage = {n[len(PREFIX):]: s for n, (_, s) in specs.items()}
    with torch.no_grad():
        for key, p in model.state_dict().items():
            if key.endswith((".w1", ".w2", ".w3")):
                flat = p.reshape(-1, p.shape[-1])
                p.copy_(mxfp4_dequantize(*mxfp4_quantize(flat), p.dtype).reshape(p.shape))
            elif storage[key] == "BF16":
                p.copy_(p.float().to(torch.bfloat16).to(p.dtype))


def write_json(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f, indent=1)
        f.write("\n")

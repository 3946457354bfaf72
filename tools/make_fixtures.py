"""Builds hyserve's transformers-based golden fixtures, deterministically (re-running reproduces every
file byte for byte).

  tests/fixtures/kimi_linear_tiny/     tiny kimi_linear saved by transformers, golden from transformers
  tests/fixtures/deepseek_v32_tiny/    tiny deepseek_v32 (YaRN, DSA) saved by transformers, golden from transformers
  tests/fixtures/deepseek_v32_fp8_tiny/ the same weights with FP8 e4m3 128x128-block decoder linears
  tests/fixtures/deepseek_v3_tiny/     tiny deepseek_v3 as DeepSeek ships V3 / R1 (its config.json layout, FP8
                                       e4m3 128x128-block linears, an MTP layer's norms), golden from transformers
  tests/fixtures/kimi_k2_tiny/         tiny kimi_k2 as Moonshot ships Kimi K2 (its config.json layout, BF16),
                                       golden from transformers' DeepseekV3 (Kimi K2 is that architecture)
  tests/fixtures/kimi_k25_tiny/        the same weights as Kimi K2.5 lays them out (text_config, language_model.
                                       names, vision tower stubs); its golden is kimi_k2_tiny's

kimi_k3 (the bundled models/tiny-kimi-k3, tests/fixtures/kimi_k3_tiny and
tests/fixtures/kimi_k3_published_tiny, in the published Kimi K3 / K3.1 Pro layout) is built by
tools/make_k3_fixtures.py (numpy only, goldens from tools/k3_reference.py), not here.

Every HF golden is also recomputed by model_md_reference.py (written from MODEL.md); the max abs
difference goes to meta.json (key max_abs_diff_vs_kimi_k3_reference, after the reference's former
name). A fixture is accepted when the min top1-top2 gap over greedy steps is
>= 1e-3 and the router / indexer top-k margins are >= 1e-5; otherwise the next seed is tried.

Usage: /work/venv/bin/python tools/make_fixtures.py [kimi_linear|deepseek_v32|deepseek_v3|kimi_k2]   (from the repository root;
needs torch, transformers and fla: tools/requirements.txt)
"""

import collections
import json
import math
import os
import shutil
import sys
import tempfile

import torch
from safetensors.torch import load_file, save_file

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

import fla.ops.kda  # noqa: E402
from fla.ops.kda.naive import naive_recurrent_kda  # noqa: E402

import model_md_reference as ref  # noqa: E402

PROMPT_LENGTHS = [5, 17, 40]
NUM_GREEDY = 32
MIN_GAP = 1e-3
MIN_MARGIN = 1e-5
MAX_ATTEMPTS = 20
# meta.json key of the max abs diff against model_md_reference.py, named after its former file
# name (kimi_k3_reference.py) and kept so regenerated fixtures match the committed ones.
REFERENCE_DIFF_KEY = "max_abs_diff_vs_kimi_k3_reference"


# ----------------------------------------------------------------------------------------------
# transformers' KDA on CPU: fla's chunk_kda / fused_recurrent_kda are Triton kernels. transformers
# binds them at import time of modeling_kimi_linear (integrations.hub_kernels.
# use_kernel_func_from_hub_with_fallback looks up fla.ops.kda.<name>), so we replace them with
# fla's pure-PyTorch naive_recurrent_kda before that import.


def cpu_kda(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
            use_qk_l2norm_in_kernel=False, **kwargs):
    if use_qk_l2norm_in_kernel:
        q, k = ref.l2norm(q.float()), ref.l2norm(k.float())
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    return naive_recurrent_kda(q, k, v, g, beta, scale=scale, initial_state=initial_state,
                               output_final_state=output_final_state)


fla.ops.kda.chunk_kda = cpu_kda
fla.ops.kda.fused_recurrent_kda = cpu_kda

from transformers import (  # noqa: E402
    DeepseekV3Config,
    DeepseekV3ForCausalLM,
    DeepseekV32Config,
    DeepseekV32ForCausalLM,
    KimiLinearConfig,
    KimiLinearForCausalLM,
)
from transformers.models.deepseek_v32 import modeling_deepseek_v32  # noqa: E402

# transformers' DSA indexer selects keys with torch.topk, whose order among equal scores is
# unspecified; exact ties are common (keys where every head's relu(q.k) is 0 score exactly 0).
# MODEL.md 3.8 fixes "lower position wins", so inside the indexer's forward topk is replaced by a
# stable descending sort. Nothing else of transformers' forward changes.
TopK = collections.namedtuple("TopK", ["values", "indices"])


def stable_topk(self, k, dim=-1, largest=True, sorted=True):
    order = torch.sort(self, dim=dim, descending=largest, stable=True)
    return TopK(order.values.narrow(dim, 0, k), order.indices.narrow(dim, 0, k))


def indexer_forward_with_stable_topk(self, *args, **kwargs):
    saved = torch.Tensor.topk
    torch.Tensor.topk = stable_topk
    try:
        return INDEXER_FORWARD(self, *args, **kwargs)
    finally:
        torch.Tensor.topk = saved


INDEXER_FORWARD = modeling_deepseek_v32.DeepseekV32Indexer.forward
modeling_deepseek_v32.DeepseekV32Indexer.forward = indexer_forward_with_stable_topk

# ----------------------------------------------------------------------------------------------
# Deterministic initialization (by tensor name, in sorted order, from one seeded generator)


def init_tensor(name, shape, gen):
    """Values chosen so that logits are well spread (top1-top2 gaps far above fp32 noise)."""

    def normal(std):
        return torch.randn(shape, generator=gen, dtype=torch.float32) * std

    def uniform(a, b):
        return torch.rand(shape, generator=gen, dtype=torch.float32) * (b - a) + a

    if "embed_tokens" in name:
        return normal(1.0)
    if name.endswith("A_log"):
        return uniform(1.0, 8.0).log()
    if name.endswith("dt_bias"):
        dt = uniform(math.log(1e-3), math.log(1e-1)).exp()
        return dt + torch.log(-torch.expm1(-dt))  # inverse softplus
    if name.endswith("e_score_correction_bias"):
        return normal(0.05)
    if name.endswith(".bias"):
        return normal(0.1)
    if len(shape) == 1:  # norm weights
        return 1.0 + normal(0.1)
    if "conv1d" in name:
        return normal(0.5)
    fan_in = shape[-1]
    if "lm_head" in name:
        return normal(4.0 / math.sqrt(fan_in))
    if name.endswith("gate.weight"):  # router
        return normal(2.0 / math.sqrt(fan_in))
    return normal(1.0 / math.sqrt(fan_in))


def bf16_round(x):
    return x.to(torch.bfloat16).to(torch.float32)


# ----------------------------------------------------------------------------------------------
# Quantizers


def quantize_fp8_block(w, block=128):
    """w fp32 [rows, cols] -> (e4m3 [rows, cols], scale_inv F32 [ceil(rows/128), ceil(cols/128)])."""
    rows, cols = w.shape
    nr, nc = -(-rows // block), -(-cols // block)
    q = torch.empty(rows, cols, dtype=torch.float8_e4m3fn)
    scale_inv = torch.empty(nr, nc, dtype=torch.float32)
    for i in range(nr):
        for j in range(nc):
            tile = w[i * block : (i + 1) * block, j * block : (j + 1) * block]
            scale = tile.abs().max() / 448.0
            scale = scale if scale > 0 else torch.tensor(1.0)
            scale_inv[i, j] = scale
            q[i * block : (i + 1) * block, j * block : (j + 1) * block] = (tile / scale).clamp(-448, 448).to(
                torch.float8_e4m3fn
            )
    return q, scale_inv


# ----------------------------------------------------------------------------------------------
# Goldens


def make_prompts(vocab):
    prompts = []
    for i, n in enumerate(PROMPT_LENGTHS):
        gen = torch.Generator().manual_seed(1000 + i)
        prompts.append(torch.randint(0, vocab, (n,), generator=gen, dtype=torch.int64))
    return prompts


def compute_goldens(forward, prompts):
    """forward(ids: LongTensor [T]) -> fp32 logits [T, V]. Full recompute at every greedy step."""
    tensors, gaps = {}, []
    for i, ids in enumerate(prompts):
        tensors[f"prompt_{i}_ids"] = ids.clone()
        tensors[f"prompt_{i}_logits"] = forward(ids).float().contiguous()
        seq, greedy, greedy_logits, min_gap = ids.clone(), [], [], math.inf
        for _ in range(NUM_GREEDY):
            last = forward(seq)[-1].float()
            top2 = torch.topk(last, 2).values
            min_gap = min(min_gap, (top2[0] - top2[1]).item())
            token = int(torch.argmax(last).item())
            greedy.append(token)
            greedy_logits.append(last)
            seq = torch.cat([seq, torch.tensor([token], dtype=torch.int64)])
        tensors[f"prompt_{i}_greedy_ids"] = torch.tensor(greedy, dtype=torch.int64)
        tensors[f"prompt_{i}_greedy_logits"] = torch.stack(greedy_logits).contiguous()
        gaps.append(min_gap)
    return tensors, gaps


def reference_check(folder, prompts, golden):
    """Runs model_md_reference on `folder` over every golden sequence; returns (max abs diff, stats)."""
    model = ref.Model(folder)
    worst = 0.0
    for i, ids in enumerate(prompts):
        full = torch.cat([ids, golden[f"prompt_{i}_greedy_ids"]])
        logits = model.forward(full)
        n = ids.shape[0]
        worst = max(worst, (logits[:n] - golden[f"prompt_{i}_logits"]).abs().max().item())
        worst = max(worst, (logits[n - 1 : n - 1 + NUM_GREEDY] - golden[f"prompt_{i}_greedy_logits"]).abs().max().item())
    return worst, model.stats.to_dict()


def accept(gaps, stats):
    return (
        min(gaps) >= MIN_GAP
        and stats["min_router_margin"] >= MIN_MARGIN
        and stats["min_indexer_rel_margin"] >= MIN_MARGIN
    )


def write_golden(out_dir, golden, meta):
    os.makedirs(out_dir, exist_ok=True)
    save_file(golden, os.path.join(out_dir, "golden.safetensors"))
    meta = {k: (None if isinstance(v, float) and math.isinf(v) else v) for k, v in meta.items()}
    with open(os.path.join(out_dir, "meta.json"), "w") as f:
        json.dump(meta, f, indent=1, sort_keys=True, allow_nan=False)
        f.write("\n")


# ----------------------------------------------------------------------------------------------
# transformers models


def init_hf_model(model, seed):
    gen = torch.Generator().manual_seed(seed)
    state = model.state_dict()
    with torch.no_grad():
        for name in sorted(state):
            value = init_tensor(name, list(state[name].shape), gen)
            state[name].copy_(bf16_round(value))


def hf_forward(model):
    def forward(ids):
        with torch.no_grad():
            return model(input_ids=ids[None], use_cache=False).logits[0].float()
    return forward


def load_hf(cls, folder):
    model = cls.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager")
    model.eval()
    return model


def kimi_linear_config():
    return KimiLinearConfig(
        vocab_size=1024, hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=5,
        num_attention_heads=4, num_key_value_heads=4, q_lora_rank=None, kv_lora_rank=32, qk_nope_head_dim=16,
        qk_rope_head_dim=8, v_head_dim=16, num_local_experts=8, num_experts_per_tok=2, n_shared_experts=1,
        n_group=1, topk_group=1, routed_scaling_factor=2.446, rms_norm_eps=1e-5,
        layer_types=["linear_attention", "linear_attention", "full_attention", "linear_attention", "full_attention"],
        mlp_layer_types=["dense", "sparse", "sparse", "sparse", "sparse"], linear_num_heads=2, linear_head_dim=32,
        linear_conv_kernel_dim=4, pad_token_id=None, bos_token_id=1, eos_token_id=2,
    )


def deepseek_v32_config():
    return DeepseekV32Config(
        vocab_size=1024, hidden_size=144, intermediate_size=192, moe_intermediate_size=16, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=4, q_lora_rank=32, kv_lora_rank=32, qk_nope_head_dim=16,
        qk_rope_head_dim=8, v_head_dim=16, n_routed_experts=16, num_experts_per_tok=4, n_shared_experts=1,
        n_group=4, topk_group=2, first_k_dense_replace=1, routed_scaling_factor=2.5, rms_norm_eps=1e-6,
        index_n_heads=4, index_head_dim=32, index_topk=8, max_position_embeddings=128,
        rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                         "original_max_position_embeddings": 32, "mscale": 1.0, "mscale_all_dim": 1.0,
                         "beta_fast": 32, "beta_slow": 1},
        pad_token_id=None, bos_token_id=1, eos_token_id=2,
    )


def save_hf(cls, config, seed, folder):
    model = cls(config)
    init_hf_model(model, seed)
    if os.path.exists(folder):
        shutil.rmtree(folder)
    model.to(torch.bfloat16).save_pretrained(folder)


def fp8_quantize_tensors(tensors):
    """Every 2-D decoder-layer linear (except the router gate and the indexer's weights_proj) as FP8 e4m3 +
    weight_scale_inv, as DeepSeek ships its checkpoints."""
    out = {}
    for name, value in sorted(tensors.items()):
        quantize = (name.startswith("model.layers.") and name.endswith(".weight") and value.dim() == 2
                    and not name.endswith("mlp.gate.weight") and "weights_proj" not in name)
        if quantize:
            q, s = quantize_fp8_block(value.float())
            out[name] = q
            out[name[: -len(".weight")] + ".weight_scale_inv"] = s
        else:
            out[name] = value
    return out


def fp8_quantize_folder(src, dst):
    """Copies src to dst with its decoder linears quantized by fp8_quantize_tensors."""
    out = fp8_quantize_tensors(load_file(os.path.join(src, "model.safetensors")))
    if os.path.exists(dst):
        shutil.rmtree(dst)
    os.makedirs(dst)
    save_file(out, os.path.join(dst, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(src, "config.json")) as f:
        config = json.load(f)
    config["quantization_config"] = {"quant_method": "fp8", "weight_block_size": [128, 128], "fmt": "e4m3"}
    with open(os.path.join(dst, "config.json"), "w") as f:
        json.dump(config, f, indent=2, sort_keys=True)
        f.write("\n")


def dequantized_copy(folder, tmp):
    """A plain fp32 copy of a quantized folder (no quantization_config) that transformers can load."""
    save_file({k: v.contiguous() for k, v in ref.load_tensors(folder).items()}, os.path.join(tmp, "model.safetensors"),
              metadata={"format": "pt"})
    with open(os.path.join(folder, "config.json")) as f:
        config = json.load(f)
    config.pop("quantization_config")
    with open(os.path.join(tmp, "config.json"), "w") as f:
        json.dump(config, f)


def make_hf_fixture(name, cls, config_fn, base_seed, fp8_name=None):
    folder = os.path.join(ROOT, "tests", "fixtures", name)
    prompts = make_prompts(config_fn().vocab_size)
    for attempt in range(MAX_ATTEMPTS):
        seed = base_seed + attempt
        save_hf(cls, config_fn(), seed, folder)
        golden, gaps = compute_goldens(hf_forward(load_hf(cls, folder)), prompts)
        diff, stats = reference_check(folder, prompts, golden)
        print(f"{name} seed {seed}: gaps {gaps} stats {stats} ref diff {diff:.3g}")
        ok = accept(gaps, stats) and diff < 1e-3
        if ok and fp8_name:
            fp8_folder = os.path.join(ROOT, "tests", "fixtures", fp8_name)
            fp8_quantize_folder(folder, fp8_folder)
            with tempfile.TemporaryDirectory() as tmp:
                dequantized_copy(fp8_folder, tmp)
                fp8_golden, fp8_gaps = compute_goldens(hf_forward(load_hf(cls, tmp)), prompts)
            fp8_diff, fp8_stats = reference_check(fp8_folder, prompts, fp8_golden)
            print(f"{fp8_name} seed {seed}: gaps {fp8_gaps} stats {fp8_stats} ref diff {fp8_diff:.3g}")
            ok = accept(fp8_gaps, fp8_stats) and fp8_diff < 1e-3
        if ok:
            break
    else:
        raise RuntimeError(f"{name}: no acceptable seed")
    write_golden(folder, golden, {"source": f"transformers {cls.__name__} (eager, fp32)", "seed": seed,
                                  "prompt_min_top1_top2_gap": gaps, REFERENCE_DIFF_KEY: diff,
                                  **stats})
    if fp8_name:
        write_golden(fp8_folder, fp8_golden, {
            "source": f"transformers {cls.__name__} (eager, fp32) with the FP8 weights dequantized", "seed": seed,
            "prompt_min_top1_top2_gap": fp8_gaps, REFERENCE_DIFF_KEY: fp8_diff, **fp8_stats})


# ----------------------------------------------------------------------------------------------
# DeepSeek-V3's architecture as its checkpoints ship it (issue 25, item 14): the config.json is written in
# the publisher's layout (rope_scaling, topk_method, auto_map, ...), not the one transformers' save_pretrained
# writes; the weights come from transformers' DeepseekV3ForCausalLM, which computes every golden.

SHIPPED_AUTO_MAP = {
    "AutoConfig": "configuration_deepseek.DeepseekV3Config",
    "AutoModel": "modeling_deepseek.DeepseekV3Model",
    "AutoModelForCausalLM": "modeling_deepseek.DeepseekV3ForCausalLM",
}


def deepseek_v3_shipped_config():
    """deepseek-ai/DeepSeek-V3's config.json, tiny: 3 layers (dense, MoE, MoE), YaRN (factor 4, original 32),
    8 experts in 4 groups (topk_group 2) top-2 + 1 shared, FP8 128x128-block weights, one MTP layer."""
    return {
        "architectures": ["DeepseekV3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
        "auto_map": SHIPPED_AUTO_MAP, "aux_loss_alpha": 0.001, "bos_token_id": 1, "eos_token_id": 2, "ep_size": 1,
        "first_k_dense_replace": 1, "hidden_act": "silu", "hidden_size": 144, "initializer_range": 0.02,
        "intermediate_size": 128, "kv_lora_rank": 32, "max_position_embeddings": 128, "model_type": "deepseek_v3",
        "moe_intermediate_size": 16, "moe_layer_freq": 1, "n_group": 4, "n_routed_experts": 8, "n_shared_experts": 1,
        "norm_topk_prob": True, "num_attention_heads": 4, "num_experts_per_tok": 2, "num_hidden_layers": 3,
        "num_key_value_heads": 4, "num_nextn_predict_layers": 1, "q_lora_rank": 32, "qk_nope_head_dim": 16,
        "qk_rope_head_dim": 8,
        "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                                "weight_block_size": [128, 128]},
        "rms_norm_eps": 1e-06,
        "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 4, "mscale": 1.0, "mscale_all_dim": 1.0,
                         "original_max_position_embeddings": 32, "type": "yarn"},
        "rope_theta": 10000, "routed_scaling_factor": 2.5, "scoring_func": "sigmoid", "seq_aux": True,
        "tie_word_embeddings": False, "topk_group": 2, "topk_method": "noaux_tc", "torch_dtype": "bfloat16",
        "transformers_version": "4.33.1", "use_cache": True, "v_head_dim": 16, "vocab_size": 256,
    }


def kimi_k2_shipped_config():
    """moonshotai/Kimi-K2-Instruct's config.json, tiny: 3 layers (dense, MoE, MoE), Kimi's YaRN (theta 50000,
    factor 32, beta_fast = beta_slow = 1, original 4: an empty correction range, widened by 0.001), 8 experts in 1 group top-2 + 1 shared, BF16."""
    return {
        "architectures": ["DeepseekV3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
        "auto_map": SHIPPED_AUTO_MAP, "aux_loss_alpha": 0.001, "bos_token_id": 1, "eos_token_id": 2, "ep_size": 1,
        "first_k_dense_replace": 1, "hidden_act": "silu", "hidden_size": 64, "initializer_range": 0.02,
        "intermediate_size": 128, "kv_lora_rank": 32, "max_position_embeddings": 128, "model_type": "kimi_k2",
        "moe_intermediate_size": 16, "moe_layer_freq": 1, "n_group": 1, "n_routed_experts": 8, "n_shared_experts": 1,
        "norm_topk_prob": True, "num_attention_heads": 4, "num_experts_per_tok": 2, "num_hidden_layers": 3,
        "num_key_value_heads": 4, "num_nextn_predict_layers": 0, "pretraining_tp": 1, "q_lora_rank": 32,
        "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "rms_norm_eps": 1e-05,
        "rope_scaling": {"beta_fast": 1.0, "beta_slow": 1.0, "factor": 32.0, "mscale": 1.0, "mscale_all_dim": 1.0,
                         "original_max_position_embeddings": 4, "type": "yarn"},
        "rope_theta": 50000.0, "routed_scaling_factor": 2.827, "scoring_func": "sigmoid", "seq_aux": True,
        "tie_word_embeddings": False, "topk_group": 1, "topk_method": "noaux_tc", "torch_dtype": "bfloat16",
        "transformers_version": "4.48.3", "use_cache": True, "v_head_dim": 16, "vocab_size": 256,
    }


def kimi_k25_shipped_config(text_config):
    """moonshotai/Kimi-K2.5's wrapper around a kimi_k2 text model (its vision_config abridged)."""
    return {
        "architectures": ["KimiK25ForConditionalGeneration"],
        "auto_map": {"AutoConfig": "configuration_kimi_k25.KimiK25Config",
                     "AutoModel": "modeling_kimi_k25.KimiK25ForConditionalGeneration",
                     "AutoModelForCausalLM": "modeling_kimi_k25.KimiK25ForConditionalGeneration"},
        "bos_token_id": 1, "eos_token_id": 2, "ignore_index": -100, "media_placeholder_token_id": 255,
        "model_type": "kimi_k25", "pad_token_id": 0, "text_config": text_config, "tie_word_embeddings": False,
        "transformers_version": "4.57.1", "use_unified_vision_chunk": True,
        "video_placeholder": "<|kimi_k25_video_placeholder|>",
        "vision_config": {"init_pos_emb_height": 4, "init_pos_emb_width": 4, "merge_kernel_size": [2, 2],
                          "mm_hidden_size": 16, "model_type": "kimi_k25_vision", "patch_size": 14,
                          "text_hidden_size": text_config["hidden_size"], "vt_hidden_size": 16,
                          "vt_num_attention_heads": 2, "vt_num_hidden_layers": 1},
    }


def hf_config_of(shipped):
    """transformers' DeepseekV3Config read from a shipped config.json (minus what only the files hold)."""
    fields = {k: v for k, v in shipped.items() if k not in ("model_type", "quantization_config", "auto_map")}
    return DeepseekV3Config.from_dict(fields)


def write_shipped(folder, config, tensors):
    if os.path.exists(folder):
        shutil.rmtree(folder)
    os.makedirs(folder)
    save_file(tensors, os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f, indent=2, sort_keys=True)
        f.write("\n")


def hf_weights(shipped, seed, tmp):
    """transformers' DeepseekV3ForCausalLM of this config with the seeded weights, saved (BF16) under tmp."""
    model = DeepseekV3ForCausalLM(hf_config_of(shipped))
    init_hf_model(model, seed)
    model.to(torch.bfloat16).save_pretrained(tmp)
    return load_file(os.path.join(tmp, "model.safetensors"))


def make_deepseek_v3_fixture(base_seed=6000):
    name = "deepseek_v3_tiny"
    folder = os.path.join(ROOT, "tests", "fixtures", name)
    shipped = deepseek_v3_shipped_config()
    prompts = make_prompts(shipped["vocab_size"])
    for attempt in range(MAX_ATTEMPTS):
        seed = base_seed + attempt
        with tempfile.TemporaryDirectory() as tmp, tempfile.TemporaryDirectory() as plain:
            tensors = fp8_quantize_tensors(hf_weights(shipped, seed, tmp))
            # The multi-token-prediction layer DeepSeek ships after the last decoder layer (its norms only):
            # serving reads num_hidden_layers layers and leaves it alone.
            mtp = f"model.layers.{shipped['num_hidden_layers']}."
            for norm in ("enorm", "hnorm", "shared_head.norm"):
                tensors[f"{mtp}{norm}.weight"] = torch.ones(shipped["hidden_size"], dtype=torch.bfloat16)
            write_shipped(folder, shipped, tensors)
            dequantized_copy(folder, plain)  # transformers reads DeepSeek's config.json layout itself
            golden, gaps = compute_goldens(hf_forward(load_hf(DeepseekV3ForCausalLM, plain)), prompts)
        diff, stats = reference_check(folder, prompts, golden)
        print(f"{name} seed {seed}: gaps {gaps} stats {stats} ref diff {diff:.3g}")
        if accept(gaps, stats) and diff < 1e-3:
            break
    else:
        raise RuntimeError(f"{name}: no acceptable seed")
    write_golden(folder, golden, {
        "source": "transformers DeepseekV3ForCausalLM (eager, fp32) with the FP8 weights dequantized", "seed": seed,
        "prompt_min_top1_top2_gap": gaps, REFERENCE_DIFF_KEY: diff, **stats})


def make_kimi_k2_fixtures(base_seed=7000):
    k2_folder = os.path.join(ROOT, "tests", "fixtures", "kimi_k2_tiny")
    k25_folder = os.path.join(ROOT, "tests", "fixtures", "kimi_k25_tiny")
    shipped = kimi_k2_shipped_config()
    prompts = make_prompts(shipped["vocab_size"])
    for attempt in range(MAX_ATTEMPTS):
        seed = base_seed + attempt
        with tempfile.TemporaryDirectory() as tmp:
            tensors = hf_weights(shipped, seed, tmp)
            golden, gaps = compute_goldens(hf_forward(load_hf(DeepseekV3ForCausalLM, tmp)), prompts)
        write_shipped(k2_folder, shipped, tensors)
        # Kimi K2.5: the same text model under language_model., beside a vision tower and projector.
        wrapped = {"language_model." + k: v for k, v in tensors.items()}
        stub = torch.Generator().manual_seed(seed)
        wrapped["vision_tower.patch_embed.proj.weight"] = torch.randn(16, 3, 14, 14, generator=stub).to(torch.bfloat16)
        wrapped["mm_projector.proj.0.weight"] = torch.randn(shipped["hidden_size"], 64, generator=stub).to(torch.bfloat16)
        write_shipped(k25_folder, kimi_k25_shipped_config(shipped), wrapped)
        diff, stats = reference_check(k2_folder, prompts, golden)
        diff_k25, _ = reference_check(k25_folder, prompts, golden)
        print(f"kimi_k2_tiny seed {seed}: gaps {gaps} stats {stats} ref diff {diff:.3g} (kimi_k25 {diff_k25:.3g})")
        if accept(gaps, stats) and max(diff, diff_k25) < 1e-3:
            break
    else:
        raise RuntimeError("kimi_k2_tiny: no acceptable seed")
    write_golden(k2_folder, golden, {
        "source": "transformers DeepseekV3ForCausalLM (eager, fp32); also the golden of kimi_k25_tiny", "seed": seed,
        "prompt_min_top1_top2_gap": gaps, REFERENCE_DIFF_KEY: max(diff, diff_k25), **stats})


def main():
    torch.set_num_threads(1)  # summation order independent of the machine
    which = sys.argv[1:] or ["kimi_linear", "deepseek_v32", "deepseek_v3", "kimi_k2"]
    if "kimi_linear" in which:
        make_hf_fixture("kimi_linear_tiny", KimiLinearForCausalLM, kimi_linear_config, 4000)
    if "deepseek_v32" in which:
        make_hf_fixture("deepseek_v32_tiny", DeepseekV32ForCausalLM, deepseek_v32_config, 5000,
                        fp8_name="deepseek_v32_fp8_tiny")
    if "deepseek_v3" in which:
        make_deepseek_v3_fixture()
    if "kimi_k2" in which:
        make_kimi_k2_fixtures()


if __name__ == "__main__":
    main()

"""Readable fp32 PyTorch reference written from shared/MODEL.md: the MODEL.md cross-check for
`kimi_linear` (no indexer, no gate, q_proj), `deepseek_v32` (YaRN RoPE, indexer with RoPE) and
DeepSeek-V3's architecture (`deepseek_v3`, Kimi K2's `kimi_k2`, Kimi K2.5's `kimi_k25` wrapper with
`text_config` and `language_model.` names: deepseek_v32 without the indexer), used by make_fixtures.py
to check transformers' modules against MODEL.md.

It is not a kimi_k3 reference: the published Kimi K3 / K3.1 Pro architecture (shared/K3.md: Block
AttnRes, SiTU, latent MoE, bounded KDA gate, compressed-tensors MXFP4) lives in tools/k3_reference.py.

Conventions (see docs/REFERENCE_NOTES.md):
  * every weight is upcast to fp32 exactly (bf16, FP8 e4m3 x block scale);
  * full recompute, no cache: forward(ids) -> logits [T, V];
  * the DSA indexer uses exact fp32 scores (no FP8 quantization, no Hadamard rotation);
    top-k ties are broken by "lower position wins";
  * the KDA recurrence core is fla's pure-PyTorch `naive_recurrent_kda`, fed with already
    l2-normalized q, k and an explicit scale K^-0.5 (self_test() checks it against a direct loop
    of MODEL.md 4.5 and against fla's chunked `naive_chunk_kda`).

Usage: python tools/model_md_reference.py MODEL_DIR [ids...]   (prints the last logits' argmax)
       python tools/model_md_reference.py --self-test
"""

import json
import math
import os
import sys

import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from fla.ops.kda.naive import naive_chunk_kda, naive_recurrent_kda


# ----------------------------------------------------------------------------------------------
# Loading


def dequantize_fp8_block(weight, scale_inv, block=128):
    """weight e4m3 [rows, cols], scale_inv F32 [ceil(rows/128), ceil(cols/128)] -> fp32 [rows, cols]."""
    rows, cols = weight.shape
    scale = scale_inv.float().repeat_interleave(block, 0)[:rows].repeat_interleave(block, 1)[:, :cols]
    return weight.float() * scale


def load_tensors(folder):
    """All tensors of a folder's *.safetensors as fp32, quantized matrices dequantized to `<p>.weight`."""
    raw = {}
    for name in sorted(os.listdir(folder)):
        if name.endswith(".safetensors"):
            raw.update(load_file(os.path.join(folder, name)))
    out = {}
    for key, value in raw.items():
        if key.endswith(".weight_scale_inv"):
            continue
        elif key.endswith(".weight") and key[: -len(".weight")] + ".weight_scale_inv" in raw:
            out[key] = dequantize_fp8_block(value, raw[key[: -len(".weight")] + ".weight_scale_inv"])
        else:
            out[key] = value.float()
    return out


def pick(cfg, *names, default=None):
    for name in names:
        if name in cfg and cfg[name] is not None:
            return cfg[name]
    return default


# Every layer MLA with interleaved RoPE (kimi_k25 is the wrapper around a kimi_k2 text model).
ROPE_MODEL_TYPES = ("deepseek_v32", "deepseek_v3", "kimi_k2")


class Config:
    """The fields the forward pass needs, accepting each family's spellings (MODEL.md 1)."""

    def __init__(self, cfg):
        self.model_type = cfg["model_type"]
        n = cfg["num_hidden_layers"]
        self.num_layers = n
        self.vocab_size = cfg["vocab_size"]
        self.hidden_size = cfg["hidden_size"]
        self.rms_norm_eps = cfg["rms_norm_eps"]
        lin = cfg.get("linear_attn_config") or {}
        if cfg.get("layer_types") and self.model_type not in ROPE_MODEL_TYPES:
            self.layer_types = list(cfg["layer_types"])
        elif lin:
            self.layer_types = [
                "linear_attention" if i + 1 in lin["kda_layers"] else "full_attention" for i in range(n)
            ]
        else:
            self.layer_types = ["full_attention"] * n
        first_dense = pick(cfg, "first_k_dense_replace", default=0)
        self.mlp_layer_types = cfg.get("mlp_layer_types") or [
            "dense" if i < first_dense else "sparse" for i in range(n)
        ]
        # MLA
        self.num_heads = cfg["num_attention_heads"]
        self.q_lora_rank = cfg.get("q_lora_rank")
        self.kv_lora_rank = cfg["kv_lora_rank"]
        self.dn = cfg["qk_nope_head_dim"]
        self.dr = cfg["qk_rope_head_dim"]
        self.dv = cfg["v_head_dim"]
        self.use_rope = self.model_type in ROPE_MODEL_TYPES
        self.rope = dict(cfg.get("rope_parameters") or cfg.get("rope_scaling") or {})
        if "type" in self.rope:  # rope_scaling as DeepSeek and Moonshot write it
            self.rope.setdefault("rope_type", self.rope["type"])
        self.rope_theta = pick(self.rope, "rope_theta", default=cfg.get("rope_theta", 10000.0))
        # DSA indexer
        self.index_n_heads = cfg.get("index_n_heads")
        self.index_head_dim = cfg.get("index_head_dim")
        self.index_topk = cfg.get("index_topk")
        self.use_indexer = self.index_n_heads is not None
        # KDA
        self.kda_heads = pick(cfg, "linear_num_heads", default=lin.get("num_heads"))
        self.kda_dim = pick(cfg, "linear_head_dim", default=lin.get("head_dim"))
        self.conv_kernel = pick(cfg, "linear_conv_kernel_dim", default=lin.get("short_conv_kernel_size"))
        # MoE
        self.num_experts = pick(cfg, "num_experts", "n_routed_experts")
        self.top_k = pick(cfg, "num_experts_per_token", "num_experts_per_tok")
        self.num_groups = pick(cfg, "num_expert_group", "n_group", default=1)
        self.topk_group = pick(cfg, "topk_group", default=1)
        self.renormalize = pick(cfg, "moe_renormalize", "norm_topk_prob", default=True)
        self.routed_scaling_factor = pick(cfg, "routed_scaling_factor", default=1.0)


# ----------------------------------------------------------------------------------------------
# Building blocks


def linear(x, w):
    return x @ w.t()


def rms_norm(x, w, eps):
    return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def layer_norm(x, w, b, eps):
    mean = x.mean(-1, keepdim=True)
    var = (x - mean).pow(2).mean(-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + eps) * w + b


def l2norm(x, eps=1e-6):
    return x / torch.sqrt(x.pow(2).sum(-1, keepdim=True) + eps)


def yarn_get_mscale(factor, mscale):
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def rope_tables(cfg, positions):
    """cos/sin [T, dr/2] for the rotary frequencies (plain or YaRN), angle = pos * inv_freq[i]."""
    dim = cfg.dr
    base = cfg.rope_theta
    pos_freqs = base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)
    inv_freq = 1.0 / pos_freqs
    attention_factor = 1.0
    if cfg.rope.get("rope_type", cfg.rope.get("type", "default")) == "yarn":
        factor = cfg.rope["factor"]
        orig = cfg.rope["original_max_position_embeddings"]
        beta_fast = cfg.rope.get("beta_fast") or 32
        beta_slow = cfg.rope.get("beta_slow") or 1
        mscale, mscale_all_dim = cfg.rope.get("mscale"), cfg.rope.get("mscale_all_dim")
        if mscale and mscale_all_dim:
            attention_factor = yarn_get_mscale(factor, mscale) / yarn_get_mscale(factor, mscale_all_dim)
        else:
            attention_factor = yarn_get_mscale(factor, 1.0)

        def correction_dim(rot):
            return dim * math.log(orig / (rot * 2 * math.pi)) / (2 * math.log(base))

        low = max(math.floor(correction_dim(beta_fast)), 0)
        high = min(math.ceil(correction_dim(beta_slow)), dim - 1)
        if low == high:
            high += 0.001
        ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
        extrapolation = 1 - ramp
        inv_freq = (inv_freq / factor) * (1 - extrapolation) + inv_freq * extrapolation
    angles = positions[:, None].float() * inv_freq[None, :]
    return angles.cos() * attention_factor, angles.sin() * attention_factor


def rope_interleaved(x, cos, sin):
    """MLA RoPE: pairs (x[2i], x[2i+1]) rotated by angle i. x [T, ..., dr], cos/sin [T, dr/2]."""
    shape = [cos.shape[0]] + [1] * (x.dim() - 2) + [cos.shape[1]]
    cos, sin = cos.view(shape), sin.view(shape)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).flatten(-2)


def rope_half_split(x, cos, sin):
    """Indexer RoPE (NeoX): x[i] pairs with x[i + dr/2]. x [T, ..., dr]."""
    shape = [cos.shape[0]] + [1] * (x.dim() - 2) + [cos.shape[1]]
    cos, sin = cos.view(shape), sin.view(shape)
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def select_topk_lower_position_wins(scores, k):
    """Indices of the k largest entries of each row; among equal scores the lower index wins."""
    order = torch.sort(scores, dim=-1, descending=True, stable=True).indices
    return order[..., :k]


class Stats:
    """Margins of the discrete choices (top-k of router / indexer), to judge fixture robustness."""

    def __init__(self):
        self.router_margin = math.inf
        self.indexer_margin = math.inf
        self.indexer_exact_ties = 0

    def to_dict(self):
        return {
            "min_router_margin": self.router_margin,
            "min_indexer_rel_margin": self.indexer_margin,
            "indexer_exact_boundary_ties": self.indexer_exact_ties,
        }


# ----------------------------------------------------------------------------------------------
# The model


class Model:
    def __init__(self, folder):
        with open(os.path.join(folder, "config.json")) as f:
            self.raw_config = json.load(f)
        self.w = load_tensors(folder)
        if self.raw_config["model_type"] == "kimi_k25":
            # The text model: its fields under text_config, its tensors under language_model.
            # (the vision tower beside it is not read).
            self.cfg = Config(self.raw_config["text_config"])
            prefix = "language_model."
            self.w = {k[len(prefix) :]: v for k, v in self.w.items() if k.startswith(prefix)}
        else:
            self.cfg = Config(self.raw_config)
        self.stats = Stats()

    def t(self, name):
        return self.w[name]

    def has(self, name):
        return name in self.w

    # MODEL.md 2 and 3
    def mla(self, i, x):
        c = self.cfg
        p = f"model.layers.{i}.self_attn."
        T = x.shape[0]
        H, dn, dr, dv = c.num_heads, c.dn, c.dr, c.dv
        if c.q_lora_rank is None:
            qr = x
            q = linear(x, self.t(p + "q_proj.weight"))
        else:
            qr = rms_norm(linear(x, self.t(p + "q_a_proj.weight")), self.t(p + "q_a_layernorm.weight"), 1e-6)
            q = linear(qr, self.t(p + "q_b_proj.weight"))
        q = q.view(T, H, dn + dr)
        q_nope, q_pe = q[..., :dn], q[..., dn:]
        ckv = linear(x, self.t(p + "kv_a_proj_with_mqa.weight"))
        latent = rms_norm(ckv[:, : c.kv_lora_rank], self.t(p + "kv_a_layernorm.weight"), 1e-6)
        k_pe = ckv[:, c.kv_lora_rank :]  # [T, dr], one head shared by all heads
        scale = (dn + dr) ** -0.5
        positions = torch.arange(T)
        if c.use_rope:
            cos, sin = rope_tables(c, positions)
            q_pe = rope_interleaved(q_pe, cos, sin)
            k_pe = rope_interleaved(k_pe, cos, sin)
            if c.rope.get("rope_type") == "yarn" and c.rope.get("mscale_all_dim"):
                m = yarn_get_mscale(c.rope["factor"], c.rope["mscale_all_dim"])
                scale = scale * m * m
        kv = linear(latent, self.t(p + "kv_b_proj.weight")).view(T, H, dn + dv)
        k_nope, v = kv[..., :dn], kv[..., dn:]
        logits = (torch.einsum("thd,shd->hts", q_nope, k_nope) + torch.einsum("thd,sd->hts", q_pe, k_pe)) * scale
        allowed = torch.tril(torch.ones(T, T, dtype=torch.bool))
        if c.use_indexer:
            allowed = self.indexer_mask(i, x, qr, positions)
        logits = logits.masked_fill(~allowed[None], float("-inf"))
        o = torch.einsum("hts,shd->thd", torch.softmax(logits, dim=-1), v)
        return linear(o.reshape(T, H * dv), self.t(p + "o_proj.weight"))

    def indexer_mask(self, i, x, qr, positions):
        """[T, T] bool: key s kept for query t (MODEL.md 3, exact fp32 scores)."""
        c = self.cfg
        p = f"model.layers.{i}.self_attn.indexer."
        T = x.shape[0]
        Hi, d = c.index_n_heads, c.index_head_dim
        qi = linear(qr, self.t(p + "wq_b.weight")).view(T, Hi, d)
        ki = layer_norm(linear(x, self.t(p + "wk.weight")), self.t(p + "k_norm.weight"), self.t(p + "k_norm.bias"), 1e-6)
        if c.use_rope:
            cos, sin = rope_tables(c, positions)
            qi = torch.cat([rope_half_split(qi[..., : c.dr], cos, sin), qi[..., c.dr :]], dim=-1)
            ki = torch.cat([rope_half_split(ki[..., : c.dr], cos, sin), ki[..., c.dr :]], dim=-1)
        w = linear(x, self.t(p + "weights_proj.weight")) * Hi**-0.5 * d**-0.5  # [T, Hi]
        qk = torch.einsum("thd,sd->tsh", qi, ki)  # [T, T, Hi]
        scores = torch.einsum("th,tsh->ts", w, torch.relu(qk))
        allowed = torch.zeros(T, T, dtype=torch.bool)
        for t in range(T):
            k = min(c.index_topk, t + 1)
            row = scores[t, : t + 1]
            chosen = select_topk_lower_position_wins(row, k)
            allowed[t, chosen] = True
            if t + 1 > k:
                sorted_row = row[torch.sort(row, descending=True, stable=True).indices]
                gap = (sorted_row[k - 1] - sorted_row[k]).item()
                if gap == 0.0:
                    # An exact tie (in practice all-zero scores: every head's relu is 0). It is robust
                    # only if every tied key has every head's q.k clearly below 0.
                    self.stats.indexer_exact_ties += 1
                    tied = (row == sorted_row[k - 1]).nonzero()[:, 0]
                    worst = qk[t, tied].max().item()
                    rel = -worst / max(1.0, qk[t, : t + 1].abs().max().item())
                    self.stats.indexer_margin = min(self.stats.indexer_margin, rel)
                else:
                    rel = gap / max(1.0, abs(sorted_row[k - 1].item()))
                    self.stats.indexer_margin = min(self.stats.indexer_margin, rel)
        return allowed

    # MODEL.md 4
    def kda(self, i, x):
        c = self.cfg
        p = f"model.layers.{i}.self_attn."
        T = x.shape[0]
        H, K = c.kda_heads, c.kda_dim

        def conv_silu(name):
            y = linear(x, self.t(p + f"{name}_proj.weight"))  # [T, C]
            w = self.t(p + f"{name}_conv1d.weight")[:, 0, :]  # [C, kernel]
            kernel = w.shape[1]
            padded = torch.cat([torch.zeros(kernel - 1, y.shape[1]), y], dim=0)
            out = torch.zeros_like(y)
            for j in range(kernel):
                out += w[:, j] * padded[j : j + T]
            return F.silu(out)

        q = conv_silu("q").view(T, H, K)
        k = conv_silu("k").view(T, H, K)
        v = conv_silu("v").view(T, H, K)
        f = linear(linear(x, self.t(p + "f_a_proj.weight")), self.t(p + "f_b_proj.weight"))
        f = f + self.t(p + "dt_bias").view(-1)
        a = torch.exp(self.t(p + "A_log").view(H))
        g = -a[:, None] * F.softplus(f.view(T, H, K), beta=1.0, threshold=20.0)  # [T, H, K], <= 0
        beta = torch.sigmoid(linear(x, self.t(p + "b_proj.weight")))  # [T, H]
        q, k = l2norm(q), l2norm(k)
        o, _ = naive_recurrent_kda(q[None], k[None], v[None], g[None], beta[None], scale=K**-0.5)
        o = o[0]  # [T, H, K]
        gate = linear(linear(x, self.t(p + "g_a_proj.weight")), self.t(p + "g_b_proj.weight")).view(T, H, K)
        o = rms_norm(o, self.t(p + "o_norm.weight"), c.rms_norm_eps) * torch.sigmoid(gate)
        return linear(o.reshape(T, H * K), self.t(p + "o_proj.weight"))

    # MODEL.md 5
    def swiglu(self, x, gate, up, down):
        return linear(F.silu(linear(x, gate)) * linear(x, up), down)

    def mlp_prefix(self, i):
        for prefix in (f"model.layers.{i}.mlp.", f"model.layers.{i}.block_sparse_moe."):
            if self.has(prefix + "gate.weight") or self.has(prefix + "gate_proj.weight"):
                return prefix
        raise KeyError(f"layer {i}: no mlp / block_sparse_moe weights")

    def expert_weights(self, prefix, e):
        base = f"{prefix}experts.{e}."
        if self.has(base + "w1.weight"):
            return self.t(base + "w1.weight"), self.t(base + "w3.weight"), self.t(base + "w2.weight")
        return self.t(base + "gate_proj.weight"), self.t(base + "up_proj.weight"), self.t(base + "down_proj.weight")

    def mlp(self, i, x):
        c = self.cfg
        prefix = self.mlp_prefix(i)
        if c.mlp_layer_types[i] == "dense":
            return self.swiglu(
                x, self.t(prefix + "gate_proj.weight"), self.t(prefix + "up_proj.weight"), self.t(prefix + "down_proj.weight")
            )
        s = torch.sigmoid(linear(x, self.t(prefix + "gate.weight")))  # [T, E]
        choice = s + self.t(prefix + "gate.e_score_correction_bias")
        E, G = c.num_experts, c.num_groups
        if G > 1:
            group_scores = choice.view(-1, G, E // G).topk(2, dim=-1).values.sum(-1)  # [T, G]
            keep = select_topk_lower_position_wins(group_scores, c.topk_group)
            sorted_groups = torch.sort(group_scores, descending=True).values
            self.stats.router_margin = min(
                self.stats.router_margin,
                (sorted_groups[:, c.topk_group - 1] - sorted_groups[:, c.topk_group]).min().item(),
            )
            group_mask = torch.zeros_like(group_scores, dtype=torch.bool).scatter(1, keep, True)
            choice = choice.masked_fill(~group_mask.repeat_interleave(E // G, dim=1), float("-inf"))
        experts = select_topk_lower_position_wins(choice, c.top_k)  # [T, k]
        sorted_choice = torch.sort(choice, descending=True).values
        if c.top_k < E:
            gaps = sorted_choice[:, c.top_k - 1] - sorted_choice[:, c.top_k]
            self.stats.router_margin = min(self.stats.router_margin, gaps.min().item())
        weights = s.gather(1, experts)
        if c.renormalize:
            weights = weights / (weights.sum(-1, keepdim=True) + 1e-20)
        weights = weights * c.routed_scaling_factor
        y = torch.zeros_like(x)
        for t in range(x.shape[0]):
            for j in range(c.top_k):
                gate, up, down = self.expert_weights(prefix, experts[t, j].item())
                y[t] += weights[t, j] * self.swiglu(x[t : t + 1], gate, up, down)[0]
        shared = prefix + "shared_experts."
        return y + self.swiglu(
            x, self.t(shared + "gate_proj.weight"), self.t(shared + "up_proj.weight"), self.t(shared + "down_proj.weight")
        )

    # MODEL.md 0
    @torch.no_grad()
    def forward(self, ids):
        c = self.cfg
        h = self.t("model.embed_tokens.weight")[torch.as_tensor(ids, dtype=torch.long)]
        for i in range(c.num_layers):
            x = rms_norm(h, self.t(f"model.layers.{i}.input_layernorm.weight"), c.rms_norm_eps)
            h = h + (self.kda(i, x) if c.layer_types[i] == "linear_attention" else self.mla(i, x))
            x = rms_norm(h, self.t(f"model.layers.{i}.post_attention_layernorm.weight"), c.rms_norm_eps)
            h = h + self.mlp(i, x)
        h = rms_norm(h, self.t("model.norm.weight"), c.rms_norm_eps)
        return linear(h, self.t("lm_head.weight"))


# ----------------------------------------------------------------------------------------------
# Self test of the KDA core


def kda_direct_loop(q, k, v, g, beta, scale):
    """MODEL.md 4.5 literally, in float64. q,k,v,g [T, H, K]; beta [T, H] -> o [T, H, V]."""
    q, k, v, g, beta = (x.double() for x in (q, k, v, g, beta))
    T, H, K = q.shape
    o = torch.zeros(T, H, v.shape[-1], dtype=torch.float64)
    for h in range(H):
        S = torch.zeros(K, v.shape[-1], dtype=torch.float64)
        for t in range(T):
            S = torch.exp(g[t, h])[:, None] * S
            S = S + beta[t, h] * torch.outer(k[t, h], v[t, h] - S.t() @ k[t, h])
            o[t, h] = S.t() @ (q[t, h] * scale)
    return o


def self_test():
    torch.manual_seed(0)
    T, H, K = 70, 2, 16
    q = l2norm(torch.randn(T, H, K))
    k = l2norm(torch.randn(T, H, K))
    v = torch.randn(T, H, K)
    g = -torch.rand(T, H, K) * 0.5
    beta = torch.rand(T, H)
    scale = K**-0.5
    ref = kda_direct_loop(q, k, v, g, beta, scale)
    rec, _ = naive_recurrent_kda(q[None], k[None], v[None], g[None], beta[None], scale=scale)
    pad = 128 - T
    padded = [torch.cat([x, torch.zeros(pad, *x.shape[1:])]) for x in (q, k, v, g, beta)]
    chunk, _ = naive_chunk_kda(*(x[None] for x in padded), scale=scale, chunk_size=64)
    err_rec = (rec[0].double() - ref).abs().max().item()
    err_chunk = (chunk[0, :T].double() - ref).abs().max().item()
    print(f"naive_recurrent_kda vs direct loop: max abs err {err_rec:.3g}")
    print(f"naive_chunk_kda     vs direct loop: max abs err {err_chunk:.3g}")
    assert err_rec < 1e-5 and err_chunk < 1e-4
    print("self test ok")


def main(argv):
    if argv[1:2] == ["--self-test"]:
        self_test()
        return
    model = Model(argv[1])
    ids = [int(a) for a in argv[2:]] or [1, 2, 3]
    logits = model.forward(ids)
    print("logits", tuple(logits.shape), "argmax of last:", logits[-1].argmax().item())


if __name__ == "__main__":
    main(sys.argv)

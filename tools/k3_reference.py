"""Readable float64 numpy reference of the PUBLISHED Kimi K3 / K3.1 Pro text model (`kimi_k3`).

Written from shared/K3.md section 3 (not from MODEL.md, and independent of model_md_reference.py,
which remains the MODEL.md cross-check reference for kimi_linear and deepseek_v32).

    Model(folder).forward(ids) -> logits float64 [T, V]      (full recompute, no cache)

What it loads (K3.md 1, 4):
  * config.json with the text model under a top-level "text_config" (the published layout), or a
    flat config whose fields are at the top level;
  * model.safetensors.index.json ({"weight_map": {name: file}}) and its shards, else
    model.safetensors, else every *.safetensors of the folder;
  * tensor names under "language_model." (the prefix is stripped; unprefixed names are accepted);
    "vision_tower.*" and "mm_projector.*" are skipped (text-only serving);
  * BF16 / F16 / F32 tensors, upcast exactly; compressed-tensors MXFP4 routed experts
    (`<p>.weight_packed` U8 [out, in/2]: byte j = element 2j in the low nibble, 2j+1 in the high
    nibble, e2m1 code c: sign = bit 3, magnitude [0, .5, 1, 1.5, 2, 3, 4, 6][c & 7];
    `<p>.weight_scale` U8 [out, in/32]: multiplier 2^(s - 127)), decoded exactly to `<p>.weight`.

Numerics contract (what the goldens made with this file mean):
  * every weight is decoded exactly, then ALL arithmetic is float64;
  * NO bf16 rounding of activations anywhere (K3.md 5 describes bf16 activations in the HF code;
    hyserve's engine keeps fp32 activations, so the goldens are the exact math and the engine is
    compared with a tolerance);
  * discrete choices: router top-k and indexer top-k ties go to the lower index / position.
    Stats records how close every discrete choice came to flipping (fixture acceptance).

Math (K3.md 3; all RMSNorms are x / sqrt(mean(x^2) + eps) * w):
  * embedding, no scaling; Block AttnRes (3.2) with snapshots at layers L % attn_res_block_size == 0,
    layer output = the new prefix sum; final AttnRes (output_attn_res_*) -> model.norm -> lm_head;
  * KDA (3.3): SiLU causal short conv on q, k, v; bounded forget gate; delta-rule recurrence as a
    plain loop; per-head o_norm times sigmoid(g_proj x);
  * MLA (3.4): NoPE, scale (dn + dr)^-0.5, sigmoid output gate; K3.1 Pro DSA indexer (6) when
    text_config has "dsa_config";
  * dense SiTU MLP on layer 0, latent MoE (3.5) after it.

Usage: python tools/k3_reference.py MODEL_DIR [ids...]   (prints the logits' shape, argmax of last)
       python tools/k3_reference.py --self-test
"""

import json
import math
import os
import struct
import sys

import numpy as np

E2M1_MAGNITUDES = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
# Tensors of the multimodal wrapper that a text-only engine must skip (K3.md 4.1, 8).
SKIPPED_PREFIXES = ("vision_tower.", "mm_projector.")
TEXT_PREFIX = "language_model."
L2NORM_EPS = 1e-6  # KDA q/k L2 norm: x / sqrt(sum x^2 + 1e-6) (K3.md 5)
MLA_NORM_EPS = 1e-6  # q_a_layernorm / kv_a_layernorm: HF KimiRMSNorm default (K3.md 5, CONFLICT resolved)


# ----------------------------------------------------------------------------------------------
# Loading


_ST_DTYPES = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "I64": "<i8", "I32": "<i4", "I16": "<i2",
              "I8": "i1", "U8": "u1", "BOOL": "?"}


def read_safetensors(path):
    """name -> numpy array for one .safetensors file. BF16 is widened to float32 exactly
    (bf16 bits << 16), since numpy has no bf16. Written here so the loader needs no framework."""
    with open(path, "rb") as f:
        data = f.read()
    (header_len,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + header_len])
    base = 8 + header_len
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        start, end = info["data_offsets"]
        raw = data[base + start : base + end]
        shape = tuple(info["shape"])
        if info["dtype"] == "BF16":
            bits = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
            out[name] = bits.view(np.float32).reshape(shape)
        else:
            out[name] = np.frombuffer(raw, dtype=_ST_DTYPES[info["dtype"]]).reshape(shape)
    return out


def decode_mxfp4(packed, scale):
    """compressed-tensors mxfp4-pack-quantized -> float64 [out, in].

    packed U8 [out, in/2]: byte j holds input element 2j (bits 0-3) and 2j+1 (bits 4-7);
    scale  U8 [out, in/32]: E8M0, multiplier 2^(s - 127) for input elements 32g .. 32g+31."""
    table = np.array(E2M1_MAGNITUDES + [-m for m in E2M1_MAGNITUDES], dtype=np.float64)
    packed = packed.astype(np.int64)
    rows = packed.shape[0]
    codes = np.stack([packed & 0xF, packed >> 4], axis=-1).reshape(rows, -1)  # [out, in]
    values = table[codes]
    multiplier = np.exp2(scale.astype(np.float64) - 127.0)  # [out, in/32]
    return values * np.repeat(multiplier, 32, axis=1)


def checkpoint_files(folder):
    index = os.path.join(folder, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            weight_map = json.load(f)["weight_map"]
        return sorted(set(weight_map.values())), weight_map
    if os.path.exists(os.path.join(folder, "model.safetensors")):
        return ["model.safetensors"], None
    return sorted(n for n in os.listdir(folder) if n.endswith(".safetensors")), None


def load_text_weights(folder):
    """Text-model tensors as float64, names without "language_model.", MXFP4 decoded to `.weight`."""
    files, weight_map = checkpoint_files(folder)
    raw = {}
    for file in files:
        tensors = read_safetensors(os.path.join(folder, file))
        if weight_map is not None:
            listed = {n for n, f in weight_map.items() if f == file}
            assert listed == set(tensors), f"{file}: index weight_map disagrees with the file"
        for name, value in tensors.items():
            if name.startswith(SKIPPED_PREFIXES):
                continue
            name = name[len(TEXT_PREFIX) :] if name.startswith(TEXT_PREFIX) else name
            assert name not in raw, f"duplicate tensor {name}"
            raw[name] = value
    out = {}
    for name, value in raw.items():
        if name.endswith(".weight_packed"):
            prefix = name[: -len(".weight_packed")]
            out[prefix + ".weight"] = decode_mxfp4(value, raw[prefix + ".weight_scale"])
        elif name.endswith((".weight_scale", ".weight_shape")):
            continue
        else:
            out[name] = value.astype(np.float64)
    return out


class Config:
    """The text_config fields the forward pass reads (K3.md 1)."""

    def __init__(self, raw):
        c = raw.get("text_config", raw)
        n = c["num_hidden_layers"]
        self.num_layers = n
        self.vocab_size = c["vocab_size"]
        self.hidden_size = c["hidden_size"]
        self.eps = c["rms_norm_eps"]
        self.attn_res_block_size = c["attn_res_block_size"]
        # layer schedule: 1-based lists (K3.md 1, 2)
        lin = c["linear_attn_config"]
        kda, full = set(lin["kda_layers"]), set(lin["full_attn_layers"])
        assert kda.isdisjoint(full) and kda | full == set(range(1, n + 1)), "bad layer schedule"
        self.is_kda = [(i + 1) in kda for i in range(n)]
        self.kda_heads = lin["num_heads"]
        self.kda_dim = lin["head_dim"]
        self.conv_kernel = lin["short_conv_kernel_size"]
        self.gate_lower_bound = lin.get("gate_lower_bound")
        self.full_rank_gate = bool(lin.get("use_full_rank_gate", False))
        # MLA
        self.num_heads = c["num_attention_heads"]
        self.q_lora_rank = c["q_lora_rank"]
        self.kv_lora_rank = c["kv_lora_rank"]
        self.dn, self.dr, self.dv = c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"]
        assert c.get("mla_use_nope", True), "only NoPE MLA is published for K3"
        self.output_gate = bool(c.get("mla_use_output_gate", False))
        # K3.1 Pro DSA indexer (K3.md 6)
        dsa = c.get("dsa_config")
        self.use_indexer = dsa is not None
        if dsa is not None:
            assert sorted(dsa["layers"]) == sorted(lin["full_attn_layers"]), "dsa layers != MLA layers"
            self.index_heads, self.index_dim, self.index_topk = (
                dsa["index_n_heads"], dsa["index_head_dim"], dsa["index_topk"])
        # FFN
        self.act = c["hidden_act"]
        assert self.act in ("situ", "silu"), self.act
        self.situ_beta = c.get("activation_situ_beta")
        self.situ_linear_beta = c.get("activation_situ_linear_beta")
        first_dense, freq = c.get("first_k_dense_replace", 0), c.get("moe_layer_freq", 1)
        self.num_experts = c.get("num_experts")
        self.is_moe = [self.num_experts is not None and i >= first_dense and i % freq == 0 for i in range(n)]
        self.top_k = c.get("num_experts_per_token")
        groups = c.get("num_expert_group", 1) or 1
        if groups > 1 and groups > (c.get("topk_group") or 1):
            raise NotImplementedError("grouped top-k with more than one group")
        assert c.get("moe_router_activation_func", "sigmoid") == "sigmoid"
        self.renormalize = bool(c.get("moe_renormalize", True))
        self.routed_scaling_factor = c.get("routed_scaling_factor", 1.0)
        self.latent_size = c.get("routed_expert_hidden_size")
        self.latent_norm = bool(c.get("latent_moe_use_norm", False))


# ----------------------------------------------------------------------------------------------
# Building blocks (float64 in, float64 out)


def linear(x, w):
    """y = x W^T (no biases anywhere in the text model)."""
    return x @ w.T


def rms_norm(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def layer_norm(x, w, b, eps):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * w + b


def l2norm(x):
    return x / np.sqrt(np.sum(x * x, axis=-1, keepdims=True) + L2NORM_EPS)


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def silu(x):
    return x * sigmoid(x)


def softplus(x):
    return np.logaddexp(0.0, x)


def softmax(x, axis):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def situ(gate, up, beta, linear_beta):
    """SituAndMul (K3.md 3.7): beta*tanh(g/beta)*sigmoid(g) * linear_beta*tanh(u/linear_beta);
    the up branch is uncapped when linear_beta is None."""
    a = beta * np.tanh(gate / beta) * sigmoid(gate)
    u = up if linear_beta is None else linear_beta * np.tanh(up / linear_beta)
    return a * u


def attn_res(current, snapshots, norm_w, proj_w, eps, stats=None):
    """Block AttnRes (K3.md 3.2): softmax-weighted mix of [snapshots..., current], per token.

    current [T, D]; snapshots: list of [T, D]; norm_w [D]; proj_w [1, D]. The score of a candidate
    is RMS-normalized(candidate) . (norm_w * proj_w[0]); the RAW candidates are mixed."""
    candidates = np.stack(list(snapshots) + [current])  # [n+1, T, D]
    keys = candidates / np.sqrt(np.mean(candidates**2, axis=-1, keepdims=True) + eps)
    scores = keys @ (norm_w * proj_w[0])  # [n+1, T]
    alpha = softmax(scores, axis=0)
    if stats is not None:
        stats.note_attn_res(alpha)
    return np.einsum("nt,ntd->td", alpha, candidates)


def causal_short_conv(x, w):
    """Depthwise causal conv: out[t, c] = sum_j w[c, j] x[t - (k-1) + j, c], x[<0] = 0."""
    T, kernel = x.shape[0], w.shape[1]
    padded = np.concatenate([np.zeros((kernel - 1, x.shape[1])), x])
    out = np.zeros_like(x)
    for j in range(kernel):
        out += w[:, j] * padded[j : j + T]
    return out


def kda_recurrence(q, k, v, g, beta):
    """Delta-rule recurrence with per-key-channel decay (K3.md 3.3), plain loop.

    q, k [T, H, K] (already l2-normalized; q already scaled by K^-0.5), v [T, H, V], g [T, H, K]
    (log decay, <= 0), beta [T, H]. Per head, S in R^{K x V} starts at 0:
        S = diag(exp(g_t)) S;  S += beta_t k_t (v_t - S^T k_t)^T;  o_t = S^T q_t."""
    T, H, K = q.shape
    o = np.zeros((T, H, v.shape[-1]))
    for h in range(H):
        S = np.zeros((K, v.shape[-1]))
        for t in range(T):
            S = np.exp(g[t, h])[:, None] * S
            S = S + beta[t, h] * np.outer(k[t, h], v[t, h] - S.T @ k[t, h])
            o[t, h] = S.T @ q[t, h]
    return o


def topk_lower_wins(scores, k):
    """Indices of the k largest entries of a 1-D array; among equal values the lower index wins."""
    return np.argsort(-scores, kind="stable")[:k]


class Stats:
    """How close the discrete choices came to flipping, to judge fixture robustness.

    min_router_margin: smallest gap between the k-th and (k+1)-th expert choice score;
    min_indexer_rel_margin: smallest relative gap at the indexer's top-k boundary (for an exact tie:
      minus the largest q.k of the tied keys' heads, relative; every tied key must have every head's
      relu(q.k) clearly 0); indexer_exact_boundary_ties: query rows with an exact boundary tie;
    attn_res_alpha_min / _max: extreme AttnRes mixing weights seen (shows the mixes are not uniform)."""

    def __init__(self):
        self.router_margin = math.inf
        self.indexer_margin = math.inf
        self.indexer_exact_ties = 0
        self.alpha_min, self.alpha_max = math.inf, -math.inf

    def note_attn_res(self, alpha):
        if alpha.shape[0] > 1:  # a mix of one candidate is trivially 1
            self.alpha_min = min(self.alpha_min, float(alpha.min()))
            self.alpha_max = max(self.alpha_max, float(alpha.max()))

    def to_dict(self):
        return {
            "min_router_margin": self.router_margin,
            "min_indexer_rel_margin": self.indexer_margin,
            "indexer_exact_boundary_ties": self.indexer_exact_ties,
            "attn_res_alpha_min": self.alpha_min,
            "attn_res_alpha_max": self.alpha_max,
        }


# ----------------------------------------------------------------------------------------------
# The model


class Model:
    def __init__(self, folder):
        with open(os.path.join(folder, "config.json")) as f:
            self.raw_config = json.load(f)
        self.cfg = Config(self.raw_config)
        self.w = load_text_weights(folder)
        self.stats = Stats()

    def t(self, name):
        return self.w[name]

    # K3.md 3.3
    def kda(self, i, x):
        c = self.cfg
        p = f"model.layers.{i}.self_attn."
        T, H, K = x.shape[0], c.kda_heads, c.kda_dim

        def conv_silu(n):
            return silu(causal_short_conv(linear(x, self.t(p + f"{n}_proj.weight")),
                                          self.t(p + f"{n}_conv1d.weight")[:, 0, :]))

        q = l2norm(conv_silu("q").reshape(T, H, K)) * K**-0.5
        k = l2norm(conv_silu("k").reshape(T, H, K))
        v = conv_silu("v").reshape(T, H, K)
        f = linear(linear(x, self.t(p + "f_a_proj.weight")), self.t(p + "f_b_proj.weight"))
        f = (f + self.t(p + "dt_bias").reshape(-1)).reshape(T, H, K)
        # A_log is stored padded (K3: [128] for 96 heads); only the first num_heads entries are used.
        a = np.exp(self.t(p + "A_log").reshape(-1)[:H])[None, :, None]
        if c.gate_lower_bound is not None:
            g = c.gate_lower_bound * sigmoid(a * f)  # bounded gate, in (lower_bound, 0)
        else:
            g = -a * softplus(f)  # Kimi-Linear gate
        beta = sigmoid(linear(x, self.t(p + "b_proj.weight")))  # [T, H]
        o = kda_recurrence(q, k, v, g, beta)
        if c.full_rank_gate:
            gate = linear(x, self.t(p + "g_proj.weight"))
        else:
            gate = linear(linear(x, self.t(p + "g_a_proj.weight")), self.t(p + "g_b_proj.weight"))
        o = rms_norm(o, self.t(p + "o_norm.weight"), c.eps) * sigmoid(gate.reshape(T, H, K))
        return linear(o.reshape(T, H * K), self.t(p + "o_proj.weight"))

    # K3.md 3.4
    def mla(self, i, x):
        c = self.cfg
        p = f"model.layers.{i}.self_attn."
        T, H, dn, dr, dv = x.shape[0], c.num_heads, c.dn, c.dr, c.dv
        cq = rms_norm(linear(x, self.t(p + "q_a_proj.weight")), self.t(p + "q_a_layernorm.weight"), MLA_NORM_EPS)
        q = linear(cq, self.t(p + "q_b_proj.weight")).reshape(T, H, dn + dr)
        ckv = linear(x, self.t(p + "kv_a_proj_with_mqa.weight"))
        latent = rms_norm(ckv[:, : c.kv_lora_rank], self.t(p + "kv_a_layernorm.weight"), MLA_NORM_EPS)
        k_pe = ckv[:, c.kv_lora_rank :]  # [T, dr], shared by all heads, never rotated (NoPE)
        kv = linear(latent, self.t(p + "kv_b_proj.weight")).reshape(T, H, dn + dv)
        k_nope, v = kv[..., :dn], kv[..., dn:]
        logits = (np.einsum("thd,shd->hts", q[..., :dn], k_nope)
                  + np.einsum("thd,sd->hts", q[..., dn:], k_pe)) * (dn + dr) ** -0.5
        allowed = np.tril(np.ones((T, T), dtype=bool))
        if c.use_indexer:
            allowed = self.indexer_mask(i, x, cq)
        logits = np.where(allowed[None], logits, -np.inf)
        o = np.einsum("hts,shd->thd", softmax(logits, axis=-1), v)
        if c.output_gate:
            o = o * sigmoid(linear(x, self.t(p + "g_proj.weight"))).reshape(T, H, dv)
        return linear(o.reshape(T, H * dv), self.t(p + "o_proj.weight"))

    # K3.md 6 (indexer math by analogy with DeepSeek-V3.2, no rope)
    def indexer_mask(self, i, x, cq):
        """[T, T] bool: key s kept for query t; top min(index_topk, t+1) causal keys by
        score[t, s] = sum_h w[t, h] relu(qi[t, h] . ki[s]), ties -> lower position."""
        c = self.cfg
        p = f"model.layers.{i}.self_attn.indexer."
        T, Hi, di = x.shape[0], c.index_heads, c.index_dim
        qi = linear(cq, self.t(p + "wq_b.weight")).reshape(T, Hi, di)
        bias = self.w.get(p + "k_norm.bias", np.zeros(di))
        ki = layer_norm(linear(x, self.t(p + "wk.weight")), self.t(p + "k_norm.weight"), bias, c.eps)
        w = linear(x, self.t(p + "weights_proj.weight")) * Hi**-0.5 * di**-0.5  # [T, Hi]
        qk = np.einsum("thd,sd->tsh", qi, ki)  # [T, S, Hi]
        scores = np.einsum("th,tsh->ts", w, np.maximum(qk, 0.0))
        allowed = np.zeros((T, T), dtype=bool)
        for t in range(T):
            k = min(c.index_topk, t + 1)
            row = scores[t, : t + 1]
            allowed[t, topk_lower_wins(row, k)] = True
            if t + 1 > k:
                ranked = row[np.argsort(-row, kind="stable")]
                gap = ranked[k - 1] - ranked[k]
                if gap == 0.0:
                    self.stats.indexer_exact_ties += 1
                    tied = np.nonzero(row == ranked[k - 1])[0]
                    rel = -qk[t, tied].max() / max(1.0, np.abs(qk[t, : t + 1]).max())
                else:
                    rel = gap / max(1.0, abs(ranked[k - 1]))
                self.stats.indexer_margin = min(self.stats.indexer_margin, float(rel))
        return allowed

    # K3.md 3.6, 3.7
    def gated_mlp(self, x, gate_w, up_w, down_w):
        c = self.cfg
        g, u = linear(x, gate_w), linear(x, up_w)
        act = situ(g, u, c.situ_beta, c.situ_linear_beta) if c.act == "situ" else silu(g) * u
        return linear(act, down_w)

    # K3.md 3.5
    def moe(self, i, z):
        c = self.cfg
        p = f"model.layers.{i}.block_sparse_moe."
        s = sigmoid(linear(z, self.t(p + "gate.weight")))  # [T, E], router on the full width
        choice = s + self.t(p + "gate.e_score_correction_bias")  # selection only
        latent = c.latent_size is not None
        u = linear(z, self.t(p + "routed_expert_down_proj.weight")) if latent else z
        y = np.zeros_like(u)
        for t in range(z.shape[0]):
            experts = topk_lower_wins(choice[t], c.top_k)
            if c.top_k < c.num_experts:
                ranked = np.sort(choice[t])[::-1]
                self.stats.router_margin = min(self.stats.router_margin, float(ranked[c.top_k - 1] - ranked[c.top_k]))
            weights = s[t, experts]
            if c.renormalize:
                weights = weights / (weights.sum() + 1e-20)
            weights = weights * c.routed_scaling_factor
            for wgt, e in zip(weights, experts):
                ep = p + f"experts.{e}."
                y[t] += wgt * self.gated_mlp(u[t : t + 1], self.t(ep + "w1.weight"), self.t(ep + "w3.weight"),
                                             self.t(ep + "w2.weight"))[0]
        if latent:
            if c.latent_norm:
                y = rms_norm(y, self.t(p + "routed_expert_norm.weight"), c.eps)
            y = linear(y, self.t(p + "routed_expert_up_proj.weight"))
        sp = p + "shared_experts."
        return y + self.gated_mlp(z, self.t(sp + "gate_proj.weight"), self.t(sp + "up_proj.weight"),
                                  self.t(sp + "down_proj.weight"))

    def ffn(self, i, z):
        if self.cfg.is_moe[i]:
            return self.moe(i, z)
        p = f"model.layers.{i}.mlp."
        return self.gated_mlp(z, self.t(p + "gate_proj.weight"), self.t(p + "up_proj.weight"),
                              self.t(p + "down_proj.weight"))

    # K3.md 3.1, 3.2
    def forward(self, ids):
        c = self.cfg
        ids = np.asarray(ids, dtype=np.int64)
        h = self.t("model.embed_tokens.weight")[ids]  # [T, D], no scaling
        snapshots = []  # the AttnRes block bank
        for i in range(c.num_layers):
            p = f"model.layers.{i}."
            prefix = h  # h is the running prefix sum of the current block
            if snapshots:  # false only at layer 0
                x_in = attn_res(prefix, snapshots, self.t(p + "self_attention_res_norm.weight"),
                                self.t(p + "self_attention_res_proj.weight"), c.eps, self.stats)
            else:
                x_in = h
            if i % c.attn_res_block_size == 0:  # block boundary: push the snapshot, restart the sum
                snapshots.append(prefix)
                prefix = None
            x = rms_norm(x_in, self.t(p + "input_layernorm.weight"), c.eps)
            a = self.kda(i, x) if c.is_kda[i] else self.mla(i, x)
            prefix = a if prefix is None else prefix + a
            y = attn_res(prefix, snapshots, self.t(p + "mlp_res_norm.weight"), self.t(p + "mlp_res_proj.weight"),
                         c.eps, self.stats)
            f = self.ffn(i, rms_norm(y, self.t(p + "post_attention_layernorm.weight"), c.eps))
            h = prefix + f  # layer output = new prefix sum (NOT h + a + f)
        h = attn_res(h, snapshots, self.t("model.output_attn_res_norm.weight"),
                     self.t("model.output_attn_res_proj.weight"), c.eps, self.stats)
        h = rms_norm(h, self.t("model.norm.weight"), c.eps)
        return linear(h, self.t("lm_head.weight"))


# ----------------------------------------------------------------------------------------------
# Self test: the KDA loop and AttnRes against second, independent formulations


def kda_chunked(q, k, v, g, beta, chunk=5):
    """The same recurrence in chunked (WY / triangular-solve) form, state carried across chunks.

    Within a chunk with cumulative log decays G_i = sum_{j<=i} g_j and entry state S0:
      residuals u_i = v_i - S'_i^T k_i solve (I + A) U = V - (k * exp(G)) S0 with
        A[i, j] = beta_j sum_d k_i[d] k_j[d] exp(G_i[d] - G_j[d])  (j < i);
      o_i = S0^T (q_i * exp(G_i)) + sum_{j<=i} beta_j (q_i . (k_j * exp(G_i - G_j))) u_j;
      S_end = exp(G_last) * S0 + sum_j beta_j (k_j * exp(G_last - G_j)) u_j^T."""
    T, H, K = q.shape
    Vd = v.shape[-1]
    o = np.zeros((T, H, Vd))
    for h in range(H):
        S0 = np.zeros((K, Vd))
        for start in range(0, T, chunk):
            sl = slice(start, min(start + chunk, T))
            qc, kc, vc, bc = q[sl, h], k[sl, h], v[sl, h], beta[sl, h]
            G = np.cumsum(g[sl, h], axis=0)  # [C, K]
            C = qc.shape[0]
            decay = np.exp(G[:, None, :] - G[None, :, :])  # [i, j, K] = exp(G_i - G_j)
            kk = np.einsum("id,jd,ijd->ij", kc, kc, decay) * bc[None, :]
            qk = np.einsum("id,jd,ijd->ij", qc, kc, decay) * bc[None, :]
            A = np.tril(kk, -1)
            U = np.linalg.solve(np.eye(C) + A, vc - (kc * np.exp(G)) @ S0)
            o[sl, h] = (qc * np.exp(G)) @ S0 + np.tril(qk) @ U
            tail = np.exp(G[-1][None, :] - G) * kc * bc[:, None]  # [C, K]
            S0 = np.exp(G[-1])[:, None] * S0 + tail.T @ U
    return o


def attn_res_per_token(current, snapshots, norm_w, proj_w, eps):
    """AttnRes written literally per token and per candidate with scalar sums."""
    T, D = current.shape
    out = np.zeros((T, D))
    for t in range(T):
        cands = [s[t] for s in snapshots] + [current[t]]
        scores = []
        for v in cands:
            rms = math.sqrt(sum(float(x) * float(x) for x in v) / D + eps)
            scores.append(sum(float(v[d]) / rms * float(norm_w[d]) * float(proj_w[0, d]) for d in range(D)))
        m = max(scores)
        e = [math.exp(s - m) for s in scores]
        for a, v in zip(e, cands):
            out[t] += a / sum(e) * v
    return out


def self_test():
    rng = np.random.default_rng(0)
    # KDA: loop vs chunked form, on l2-normalized keys with a wide range of decays.
    T, H, K, Vd = 23, 2, 8, 6
    q = l2norm(rng.standard_normal((T, H, K))) * K**-0.5
    k = l2norm(rng.standard_normal((T, H, K)))
    v = rng.standard_normal((T, H, Vd))
    g = -5.0 * sigmoid(rng.standard_normal((T, H, K)) * 2.0)
    beta = sigmoid(rng.standard_normal((T, H)))
    err_kda = np.abs(kda_recurrence(q, k, v, g, beta) - kda_chunked(q, k, v, g, beta)).max()
    print(f"KDA loop vs chunked (WY) form:      max abs err {err_kda:.3g}")
    # AttnRes: vectorized vs per-token scalar loop, raw candidates of very different scales.
    D = 12
    snaps = [rng.standard_normal((5, D)) * s for s in (1.0, 3.0, 0.2)]
    cur = rng.standard_normal((5, D)) * 2.0
    nw, pw = 1.0 + 0.3 * rng.standard_normal(D), rng.standard_normal((1, D))
    err_res = np.abs(attn_res(cur, snaps, nw, pw, 1e-5) - attn_res_per_token(cur, snaps, nw, pw, 1e-5)).max()
    print(f"AttnRes vectorized vs per-token:    max abs err {err_res:.3g}")
    # MXFP4: vectorized decode vs a bit-by-bit scalar decode.
    packed = rng.integers(0, 256, (3, 32), dtype=np.uint8)
    scale = rng.integers(120, 134, (3, 2), dtype=np.uint8)
    dec = decode_mxfp4(packed, scale)
    for o in range(3):
        for i in range(64):
            byte = int(packed[o, i // 2])
            code = (byte >> 4) if i % 2 else (byte & 0xF)
            val = (-1.0 if code & 8 else 1.0) * E2M1_MAGNITUDES[code & 7] * 2.0 ** (int(scale[o, i // 32]) - 127)
            assert dec[o, i] == val, (o, i)
    print("MXFP4 decode vs scalar decode:      exact")
    assert err_kda < 1e-12 and err_res < 1e-12
    print("self test ok")


def main(argv):
    if argv[1:2] == ["--self-test"]:
        self_test()
        return
    model = Model(argv[1])
    ids = [int(a) for a in argv[2:]] or [1, 2, 3]
    logits = model.forward(ids)
    print("logits", tuple(logits.shape), "argmax of last:", int(logits[-1].argmax()))


if __name__ == "__main__":
    main(sys.argv)

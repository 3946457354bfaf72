"""A trainable PyTorch kimi_k3 / K3.1 Pro text model, written from shared/K3.md 3 and 6 (issue 50).

    KimiK3(config)(ids [B, T]) -> (logits [B, T, V], aux)

`config` is the published config.json dict (nested "text_config"); parameter names are the
checkpoint's without "language_model." (tools/tiny_k3/export.py maps the stacked experts to
`experts.<e>.w{1,2,3}`), so a state_dict is one rename away from the published layout.

Math (the same as tools/k3_reference.py; no bf16 rounding of activations inside the model, only
bf16 matmuls when the caller enables autocast):
  * embedding, Block AttnRes (K3.md 3.2: snapshots at L % attn_res_block_size == 0, the layer
    output is the new prefix sum), output AttnRes -> model.norm -> lm_head;
  * KDA (3.3): SiLU causal short conv on q, k, v; bounded forget gate
    g = lower_bound * sigmoid(exp(A_log[h]) (f + dt_bias)); per-head L2 norm; the delta rule in
    chunked WY form (`delta_rule_chunked`, fp32, exact; checked against the plain loop by
    tools/tiny_k3/check_export.py); o_norm times sigmoid(g_proj x) (full-rank output gate);
  * MLA (3.4): NoPE, scale (dn + dr)^-0.5, sigmoid output gate; K3.1 Pro DSA indexer (6):
    score[t, s] = sum_h w[t, h] relu(qi[t, h] . ki[s]); with `sparse=True` each query attends its
    top min(index_topk, t + 1) causal keys (ties: lower position), as hyserve and k3_reference do;
    in training (`sparse=False`) attention is dense and the indexer learns by KL to the dense
    attention averaged over heads, on detached inputs (DeepSeek-V3.2's dense warm-up): its loss
    is `aux["indexer_kl"]` and it never changes the main model's gradients;
  * SiTU dense MLP on layer 0; latent MoE (3.5): sigmoid router on the full width,
    e_score_correction_bias for selection only (auxiliary-loss-free balancing: the trainer moves
    it against each expert's load), renormalized top-k weights, SiTU experts on the latent, the
    combine's RMSNorm, the up-projection, one shared SiTU MLP. Experts are evaluated densely and
    masked (deterministic; the tiny model has few experts). `fake_quant_experts = True` runs the
    experts on MXFP4-rounded weights with a straight-through gradient (`mxfp4_fake_quant`, the
    same rounding as the export).
"""

import math
import os
import sys

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from k3_reference import L2NORM_EPS, MLA_NORM_EPS, Config  # noqa: E402

E2M1_GRID = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


# ----------------------------------------------------------------------------------------------
# Building blocks


def up(x):
    """fp32 for half-precision tensors (autocast), unchanged for fp32 / fp64 (the float64 check)."""
    return x.float() if x.dtype in (torch.bfloat16, torch.float16) else x


def rms_norm(x, w, eps):
    xf = up(x)
    out = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return out * w.to(out.dtype)


class RMSNorm(nn.Module):
    def __init__(self, dim, eps, dtype=torch.float32):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim, dtype=dtype))
        self.eps = eps

    def forward(self, x):
        return rms_norm(x, self.weight, self.eps)


def linear(d_in, d_out):
    return nn.Linear(d_in, d_out, bias=False)


def situ(gate, up_in, beta, linear_beta):
    """SituAndMul (K3.md 3.7), fp32."""
    gate, u = up(gate), up(up_in)
    a = beta * torch.tanh(gate / beta) * torch.sigmoid(gate)
    return a * (linear_beta * torch.tanh(u / linear_beta))


def attn_res(current, snapshots, norm_w, proj_w, eps):
    """Block AttnRes (K3.md 3.2): softmax over [snapshots..., current] of RMS-normalized
    candidate . (norm_w * proj_w[0]); mixes the raw candidates. fp32."""
    cands = torch.stack([up(s) for s in snapshots] + [up(current)])  # [n+1, B, T, D]
    keys = cands * torch.rsqrt(cands.pow(2).mean(-1, keepdim=True) + eps)
    w = norm_w.to(cands.dtype) * proj_w[0].to(cands.dtype)
    alpha = torch.softmax(keys @ w, dim=0)  # [n+1, B, T]
    return (alpha.unsqueeze(-1) * cands).sum(0)


def l2norm(x):
    return x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) + L2NORM_EPS)


def delta_rule_chunked(q, k, v, g, beta, chunk=16):
    """The KDA recurrence (K3.md 3.3) in chunked WY form, exact up to rounding.

    q, k [B, T, H, K] (q already scaled), v [B, T, H, V], g [B, T, H, K] log decays in (-5, 0],
    beta [B, T, H]. Per head S starts at 0: S = diag(exp g_t) S; S += beta_t k_t (v_t - S^T k_t)^T;
    o_t = S^T q_t. Within a chunk with inclusive cumulative decays G and entry state S0:
      (I + A) U = V - (k e^G) S0,  A[i, j] = beta_j (k_i e^{G_i}) . (k_j e^{-G_j})  (j < i)
      o_i = (q_i e^{G_i})^T S0 + sum_{j <= i} beta_j (q_i e^{G_i}) . (k_j e^{-G_j}) u_j
      S_end = e^{G_C} S0 + sum_j beta_j (k_j e^{G_C - G_j}) u_j^T.
    The e^{+-G} factors are taken relative to the chunk's middle, so with g > -5 and 16 tokens
    they stay within e^{+-40}, and so does every product of two of them, the discarded upper
    triangle of k_pos k_neg^T included (e^{80} < fp32's 3.4e38). With 32-token chunks that
    upper triangle reached e^{160}: inf in the forward pass, masked away by tril, but beta's
    gradient took inf * 0 = NaN once a head's gates averaged below -2.75 over a chunk (training
    on the GPU went NaN that way). The intra-chunk solves run for all chunks at once; only the
    state passes from chunk to chunk."""
    dtype = q.dtype if q.dtype == torch.float64 else torch.float32
    q, k, v, g, beta = (t.to(dtype) for t in (q, k, v, g, beta))
    B, T, H, K = q.shape
    Vd = v.shape[-1]
    pad = (-T) % chunk
    if pad:  # trailing zero tokens (g = 0, k = 0, beta = 0) leave the earlier outputs unchanged
        q, k, v, g = (F.pad(t, (0, 0, 0, 0, 0, pad)) for t in (q, k, v, g))
        beta = F.pad(beta, (0, 0, 0, pad))
    N = (T + pad) // chunk

    def chunks(t):  # [B, T, H, X] -> [B, H, N, C, X]
        return t.transpose(1, 2).reshape(B, H, N, chunk, t.shape[-1])

    q, k, v, g = chunks(q), chunks(k), chunks(v), chunks(g)
    beta = beta.transpose(1, 2).reshape(B, H, N, chunk)
    G = g.cumsum(-2)
    Gc = G - G[..., chunk // 2 - 1 : chunk // 2, :]
    k_pos, k_neg = k * Gc.exp(), k * (-Gc).exp()
    q_pos = q * Gc.exp()
    A = torch.tril((k_pos @ k_neg.transpose(-1, -2)) * beta.unsqueeze(-2), -1)
    Aqk = torch.tril((q_pos @ k_neg.transpose(-1, -2)) * beta.unsqueeze(-2))
    eye = torch.eye(chunk, dtype=dtype, device=q.device)
    rhs = torch.cat([v, k * G.exp()], dim=-1)
    W = torch.linalg.solve_triangular(eye + A, rhs, upper=False, unitriangular=True)
    W0, W1 = W[..., :Vd], W[..., Vd:]  # U = W0 - W1 S0
    q_dec = q * G.exp()
    k_tail = k * (G[..., -1:, :] - G).exp() * beta.unsqueeze(-1)
    last = G[..., -1, :].exp().unsqueeze(-1)  # [B, H, N, K, 1]
    S = torch.zeros(B, H, K, Vd, dtype=dtype, device=q.device)
    outs = []
    for n in range(N):
        U = W0[:, :, n] - W1[:, :, n] @ S
        outs.append(q_dec[:, :, n] @ S + Aqk[:, :, n] @ U)
        S = last[:, :, n] * S + k_tail[:, :, n].transpose(-1, -2) @ U
    o = torch.stack(outs, dim=2).reshape(B, H, N * chunk, Vd)[:, :, :T]
    return o.transpose(1, 2)


def delta_rule_loop(q, k, v, g, beta):
    """The same recurrence token by token (the check of delta_rule_chunked)."""
    B, T, H, K = q.shape
    S = torch.zeros(B, H, K, v.shape[-1], dtype=q.dtype, device=q.device)
    outs = []
    for t in range(T):
        S = g[:, t].exp().unsqueeze(-1) * S
        u = v[:, t] - (S * k[:, t].unsqueeze(-1)).sum(-2)
        S = S + beta[:, t, :, None, None] * k[:, t].unsqueeze(-1) * u.unsqueeze(-2)
        outs.append((S * q[:, t].unsqueeze(-1)).sum(-2))
    return torch.stack(outs, dim=1)


def mxfp4_quantize(w):
    """w [out, in] -> (codes int64 [out, in] in 0..15, bit 3 = sign; exponents int64 [out, in/32]).

    The rounding of tools/make_k3_fixtures.py's quantize_mxfp4 (what the export writes): per
    32-element block, exponent = ceil(log2(amax / 6)) (amax = 0: -127), clamped to [-127, 127];
    each element / 2^exponent rounded to the nearest e2m1 magnitude, ties to the even code."""
    rows, cols = w.shape
    blocks = w.detach().to(torch.float64).reshape(rows, cols // 32, 32)
    amax = blocks.abs().amax(-1)
    exp = torch.ceil(torch.log2(amax / 6.0)).clamp(-127, 127)
    exp = torch.where(amax > 0, exp, torch.full_like(exp, -127.0))
    scaled = (blocks.to(torch.float32) / torch.exp2(exp).to(torch.float32).unsqueeze(-1)).to(torch.float64)
    grid = torch.tensor(E2M1_GRID, dtype=torch.float64, device=w.device)
    dist = (scaled.abs().unsqueeze(-1) - grid).abs()
    code = dist.argmin(-1)  # first (lower) code on ties
    best = dist.gather(-1, code.unsqueeze(-1)).squeeze(-1)
    nxt = dist.gather(-1, code.clamp(max=6).add(1).unsqueeze(-1)).squeeze(-1)
    code = torch.where((code % 2 == 1) & (code < 7) & (nxt == best), code + 1, code)
    sign = ((scaled < 0) & (code != 0)).long() << 3
    return (code | sign).reshape(rows, cols), exp.long()


def mxfp4_dequantize(codes, exps, dtype):
    grid = torch.tensor(E2M1_GRID, dtype=torch.float64, device=codes.device)
    mag = grid[codes & 7] * torch.where(codes & 8 != 0, -1.0, 1.0).to(torch.float64)
    return (mag * torch.exp2(exps.to(torch.float64)).repeat_interleave(32, dim=1)).to(dtype)


def mxfp4_fake_quant(w):
    """MXFP4-rounded w [..., out, in] with a straight-through gradient."""
    flat = w.reshape(-1, w.shape[-1])
    q = mxfp4_dequantize(*mxfp4_quantize(flat), w.dtype).reshape(w.shape)
    return w + (q - w).detach()


# ----------------------------------------------------------------------------------------------
# Attention


class KimiDeltaAttention(nn.Module):
    def __init__(self, cfg, D):
        super().__init__()
        H, K, P = cfg.kda_heads, cfg.kda_dim, cfg.kda_heads * cfg.kda_dim
        self.H, self.K, self.cfg = H, K, cfg
        for n in "qkv":
            setattr(self, f"{n}_proj", linear(D, P))
            setattr(self, f"{n}_conv1d", nn.Conv1d(P, P, cfg.conv_kernel, groups=P, bias=False))
        self.f_a_proj, self.f_b_proj = linear(D, K), linear(K, P)
        self.b_proj = linear(D, H)
        # A_log stored padded to head_dim (as K3 stores [128] for 96 heads); entries >= H unused, 0.
        self.A_log = nn.Parameter(torch.zeros(K))
        self.dt_bias = nn.Parameter(torch.zeros(P))
        self.o_norm = RMSNorm(K, cfg.eps)
        self.g_proj, self.o_proj = linear(D, P), linear(P, D)

    def short_conv(self, x, conv):  # causal depthwise conv + SiLU, x [B, T, P]
        w = conv.weight
        y = F.conv1d(F.pad(x.transpose(1, 2), (w.shape[-1] - 1, 0)), w.to(x.dtype), groups=w.shape[0])
        return F.silu(y.transpose(1, 2))

    def forward(self, x, loop=False):
        B, T, _ = x.shape
        H, K = self.H, self.K
        q = l2norm(up(self.short_conv(self.q_proj(x), self.q_conv1d)).reshape(B, T, H, K)) * K**-0.5
        k = l2norm(up(self.short_conv(self.k_proj(x), self.k_conv1d)).reshape(B, T, H, K))
        v = up(self.short_conv(self.v_proj(x), self.v_conv1d)).reshape(B, T, H, K)
        f = (up(self.f_b_proj(self.f_a_proj(x))) + self.dt_bias).reshape(B, T, H, K)
        a = self.A_log[:H].exp()[:, None]
        g = self.cfg.gate_lower_bound * torch.sigmoid(a * f)
        beta = torch.sigmoid(up(self.b_proj(x)))
        with torch.autocast(x.device.type, enabled=False):
            o = (delta_rule_loop if loop else delta_rule_chunked)(q, k, v, g, beta)
        o = self.o_norm(o) * torch.sigmoid(up(self.g_proj(x)).reshape(B, T, H, K))
        return self.o_proj(o.reshape(B, T, H * K).to(x.dtype))


class Indexer(nn.Module):
    """K3.1 Pro lightning indexer (K3.md 6, DeepSeek-V3.2 form, no rope)."""

    def __init__(self, cfg, D):
        super().__init__()
        self.Hi, self.di, self.topk = cfg.index_heads, cfg.index_dim, cfg.index_topk
        self.wq_b = linear(cfg.q_lora_rank, self.Hi * self.di)
        self.wk = linear(D, self.di)
        self.k_norm = nn.LayerNorm(self.di, eps=cfg.eps)
        self.weights_proj = linear(D, self.Hi)

    def forward(self, x, cq):  # -> scores [B, T, S]
        B, T, _ = x.shape
        qi = self.wq_b(cq).reshape(B, T, self.Hi, self.di)
        ki = self.k_norm(self.wk(x))
        w = self.weights_proj(x) * (self.Hi**-0.5 * self.di**-0.5)
        qk = up(torch.einsum("bthd,bsd->btsh", qi, ki))
        return torch.einsum("bth,btsh->bts", up(w), qk.clamp(min=0))

    def topk_mask(self, scores, causal):
        """[B, T, S] bool: the top min(topk, t + 1) causal keys of each query, ties -> lower s."""
        order = torch.argsort(scores.masked_fill(~causal, -math.inf), dim=-1, descending=True, stable=True)
        rank = torch.empty_like(order)
        rank.scatter_(-1, order, torch.arange(scores.shape[-1], device=scores.device).expand_as(order))
        return causal & (rank < self.topk)


class KimiMLAAttention(nn.Module):
    def __init__(self, cfg, D):
        super().__init__()
        H, dn, dr, dv = cfg.num_heads, cfg.dn, cfg.dr, cfg.dv
        self.cfg = cfg
        self.q_a_proj = linear(D, cfg.q_lora_rank)
        self.q_a_layernorm = RMSNorm(cfg.q_lora_rank, MLA_NORM_EPS)
        self.q_b_proj = linear(cfg.q_lora_rank, H * (dn + dr))
        self.kv_a_proj_with_mqa = linear(D, cfg.kv_lora_rank + dr)
        self.kv_a_layernorm = RMSNorm(cfg.kv_lora_rank, MLA_NORM_EPS)
        self.kv_b_proj = linear(cfg.kv_lora_rank, H * (dn + dv))
        self.g_proj, self.o_proj = linear(D, H * dv), linear(H * dv, D)
        self.indexer = Indexer(cfg, D) if cfg.use_indexer else None

    def forward(self, x, sparse, aux):
        c = self.cfg
        B, T, _ = x.shape
        H, dn, dr, dv = c.num_heads, c.dn, c.dr, c.dv
        cq = self.q_a_layernorm(self.q_a_proj(x)).to(x.dtype)
        q = self.q_b_proj(cq).reshape(B, T, H, dn + dr)
        ckv = self.kv_a_proj_with_mqa(x)
        latent = self.kv_a_layernorm(ckv[..., : c.kv_lora_rank]).to(x.dtype)
        k_pe = ckv[..., c.kv_lora_rank :]
        kv = self.kv_b_proj(latent).reshape(B, T, H, dn + dv)
        k_nope, v = kv[..., :dn], kv[..., dn:]
        logits = (torch.einsum("bthd,bshd->bhts", q[..., :dn], k_nope)
                  + torch.einsum("bthd,bsd->bhts", q[..., dn:], k_pe))
        logits = up(logits) * (dn + dr) ** -0.5
        causal = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
        allowed = causal
        if self.indexer is not None:
            if sparse:
                allowed = self.indexer.topk_mask(self.indexer(x, cq), causal)[:, None]
            elif self.training:
                scores = self.indexer(x.detach(), cq.detach()).masked_fill(~causal, -math.inf)
                with torch.no_grad():
                    target = torch.softmax(logits.masked_fill(~causal, -math.inf), -1).mean(1)
                logq = torch.log_softmax(scores, -1)
                kl = (target * (target.clamp_min(1e-30).log() - logq)).masked_fill(~causal, 0).sum(-1)
                aux["indexer_kl"] = aux.get("indexer_kl", 0.0) + kl.mean()
        probs = torch.softmax(logits.masked_fill(~allowed, -math.inf), -1)
        o = torch.einsum("bhts,bshd->bthd", probs.to(v.dtype), v)
        o = up(o) * torch.sigmoid(up(self.g_proj(x))).reshape(B, T, H, dv)
        return self.o_proj(o.reshape(B, T, H * dv).to(x.dtype))


# ----------------------------------------------------------------------------------------------
# Feed-forward


class SituMLP(nn.Module):
    def __init__(self, cfg, D, inner):
        super().__init__()
        self.cfg = cfg
        self.gate_proj, self.up_proj, self.down_proj = linear(D, inner), linear(D, inner), linear(inner, D)

    def forward(self, x):
        c = self.cfg
        act = situ(self.gate_proj(x), self.up_proj(x), c.situ_beta, c.situ_linear_beta)
        return self.down_proj(act.to(x.dtype))


class MoEGate(nn.Module):
    def __init__(self, E, D):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(E, D))
        self.register_buffer("e_score_correction_bias", torch.zeros(E))


class LatentMoE(nn.Module):
    def __init__(self, cfg, raw, D):
        super().__init__()
        E, L, I = cfg.num_experts, cfg.latent_size, raw["moe_intermediate_size"]
        self.cfg = cfg
        self.gate = MoEGate(E, D)
        self.routed_expert_down_proj = linear(D, L)
        self.routed_expert_norm = RMSNorm(L, cfg.eps)
        self.routed_expert_up_proj = linear(L, D)
        # experts.<e>.w1 / w3 [I, L], w2 [L, I], stacked over e
        self.w1 = nn.Parameter(torch.empty(E, I, L))
        self.w3 = nn.Parameter(torch.empty(E, I, L))
        self.w2 = nn.Parameter(torch.empty(E, L, I))
        self.shared_experts = SituMLP(cfg, D, raw["moe_intermediate_size"] * raw["num_shared_experts"])
        self.fake_quant_experts = False

    def forward(self, z, aux):
        c = self.cfg
        B, T, D = z.shape
        zf = z.reshape(B * T, D)
        with torch.autocast(z.device.type, enabled=False):
            s = torch.sigmoid(up(zf) @ self.gate.weight.t())
            choice = (s + self.gate.e_score_correction_bias.to(s.dtype)).detach()
            idx = torch.argsort(choice, dim=-1, descending=True, stable=True)[:, : c.top_k]
            mask = torch.zeros_like(s).scatter_(1, idx, 1.0)
            wts = s * mask
            if c.renormalize:
                wts = wts / (wts.sum(-1, keepdim=True) + 1e-20)
            wts = wts * c.routed_scaling_factor  # [N, E], zero off the top-k
        aux.setdefault("expert_load", []).append(mask.sum(0).detach())
        u = self.routed_expert_down_proj(zf)  # [N, L]
        w1, w3, w2 = self.w1, self.w3, self.w2
        if self.fake_quant_experts:
            w1, w3, w2 = mxfp4_fake_quant(w1), mxfp4_fake_quant(w3), mxfp4_fake_quant(w2)
        h1 = torch.einsum("nl,eil->eni", u, w1.to(u.dtype))
        h3 = torch.einsum("nl,eil->eni", u, w3.to(u.dtype))
        act = situ(h1, h3, c.situ_beta, c.situ_linear_beta).to(u.dtype)
        out = torch.einsum("eni,eli->enl", act, w2.to(u.dtype))  # [E, N, L]
        y = torch.einsum("ne,enl->nl", wts.to(out.dtype), out)
        y = self.routed_expert_up_proj(self.routed_expert_norm(y).to(z.dtype))
        return (y + self.shared_experts(zf)).reshape(B, T, D)


# ----------------------------------------------------------------------------------------------
# Layers and model


class DecoderLayer(nn.Module):
    def __init__(self, cfg, raw, D, i):
        super().__init__()
        self.i, self.cfg = i, cfg
        for n in ("input_layernorm", "post_attention_layernorm", "self_attention_res_norm", "mlp_res_norm"):
            setattr(self, n, RMSNorm(D, cfg.eps))
        self.self_attention_res_proj, self.mlp_res_proj = linear(D, 1), linear(D, 1)
        self.self_attn = KimiDeltaAttention(cfg, D) if cfg.is_kda[i] else KimiMLAAttention(cfg, D)
        if cfg.is_moe[i]:
            self.block_sparse_moe = LatentMoE(cfg, raw, D)
        else:
            self.mlp = SituMLP(cfg, D, raw["intermediate_size"])

    def forward(self, h, snapshots, sparse, aux, kda_loop):
        c, dtype = self.cfg, h.dtype
        prefix = h
        if snapshots:
            x_in = attn_res(prefix, snapshots, self.self_attention_res_norm.weight,
                            self.self_attention_res_proj.weight, c.eps).to(dtype)
        else:
            x_in = h
        if self.i % c.attn_res_block_size == 0:
            snapshots.append(prefix)
            prefix = None
        x = self.input_layernorm(x_in).to(dtype)
        if c.is_kda[self.i]:
            a = self.self_attn(x, loop=kda_loop)
        else:
            a = self.self_attn(x, sparse, aux)
        prefix = a if prefix is None else prefix + a
        y = attn_res(prefix, snapshots, self.mlp_res_norm.weight, self.mlp_res_proj.weight, c.eps).to(dtype)
        z = self.post_attention_layernorm(y).to(dtype)
        f = self.block_sparse_moe(z, aux) if c.is_moe[self.i] else self.mlp(z)
        return prefix + f


class TextModel(nn.Module):
    def __init__(self, cfg, raw):
        super().__init__()
        D = cfg.hidden_size
        self.embed_tokens = nn.Embedding(cfg.vocab_size, D)
        self.layers = nn.ModuleList(DecoderLayer(cfg, raw, D, i) for i in range(cfg.num_layers))
        self.norm = RMSNorm(D, cfg.eps)
        self.output_attn_res_norm = RMSNorm(D, cfg.eps)
        self.output_attn_res_proj = linear(D, 1)


class KimiK3(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.raw = config.get("text_config", config)
        self.cfg = Config(config)
        assert self.cfg.gate_lower_bound is not None and self.cfg.full_rank_gate, "kimi_k3 KDA only"
        assert self.cfg.act == "situ" and self.cfg.latent_size is not None and self.cfg.latent_norm
        self.model = TextModel(self.cfg, self.raw)
        self.lm_head = linear(self.cfg.hidden_size, self.cfg.vocab_size)

    def moe_layers(self):
        return [l.block_sparse_moe for l in self.model.layers if hasattr(l, "block_sparse_moe")]

    def set_fake_quant(self, on):
        for m in self.moe_layers():
            m.fake_quant_experts = on

    def forward(self, ids, sparse=False, kda_loop=False):
        """ids [B, T] -> (logits fp32 [B, T, V], aux: indexer_kl (training, dense), expert_load)."""
        c, m, aux = self.cfg, self.model, {}
        h = m.embed_tokens(ids)  # the residual stream stays in the parameters' dtype
        dtype = h.dtype
        snapshots = []
        for layer in m.layers:
            h = layer(h, snapshots, sparse, aux, kda_loop).to(dtype)
        h = attn_res(h, snapshots, m.output_attn_res_norm.weight, m.output_attn_res_proj.weight, c.eps)
        h = m.norm(h)
        with torch.autocast(ids.device.type, enabled=False):
            logits = up(h) @ self.lm_head.weight.t()
        return logits, aux


def init_weights(model, seed_generator=None):
    """Training init: N(0, 0.02) projections, output projections scaled by 1/sqrt(2 layers),
    norms 1, AttnRes queries 0 (uniform mixes at the start), KDA decays spread over
    dt_bias in [-8, -2] with A_log = 0 (per-token decay exp(-5 sigmoid(f + dt_bias)) ~ 0.6 .. 0.9998),
    conv kernels as nn.Conv1d's default."""
    std = 0.02
    n = model.cfg.num_layers
    gen = seed_generator
    for name, p in model.named_parameters():
        with torch.no_grad():
            if name.endswith(("_res_proj.weight",)) or name.endswith("A_log"):
                p.zero_()
            elif name.endswith("dt_bias"):
                p.uniform_(-8.0, -2.0, generator=gen)
            elif "conv1d" in name:
                p.uniform_(-0.5, 0.5, generator=gen)
            elif p.ndim == 1:
                p.fill_(1.0) if not name.endswith(".bias") else p.zero_()
            elif name.endswith(("o_proj.weight", "down_proj.weight", "w2", "routed_expert_up_proj.weight")):
                p.normal_(0.0, std / math.sqrt(2 * n), generator=gen)
            else:
                p.normal_(0.0, std, generator=gen)

"""Trains the tiny Kimi K3.1 Pro that speaks (issue 50) and exports it in the published layout.

    python tools/tiny_k3/train.py --out DIR [--max-steps 1500] [--seed 0] ...

Reads the token ids of tools/tiny_k3/tokenize_corpus.py (.cache/tiny-k3-speaks/tokens/, made on
a machine with the `regex` wheel; the GPU machine needs torch, numpy and safetensors only) and
writes into DIR:
  tiny-k3-speaks/   config.json, model.safetensors (BF16 + MXFP4 routed experts, the published
                    K3.1 Pro layout), tiktoken.model, tokenizer_config.json
  loss_curve.jsonl  one JSON line per logged step ({"step", "loss", "indexer_kl", "lr", ...}) and
                    per evaluation ({"eval": ..., "heldout_ppl": ...}); also printed on stdout
  result.json       the config, step count, wall times and the held-out perplexities

Training: random windows of --seq tokens of the training split (a seeded torch.Generator), AdamW
(betas 0.9 / 0.95, weight decay 0.1 on matrices), linear warm-up then cosine decay to 5% of --lr,
gradient clipping 1.0, bf16 autocast on a GPU (fp32 master weights; the KDA recurrence, norms,
softmaxes, SiTU and the router in fp32), fp32 on a CPU. The MoE is balanced without an auxiliary
loss: after each step every MoE layer's e_score_correction_bias moves by --bias-rate against the
sign of its expert's load minus the mean load. The DSA indexer learns by KL to the dense attention
on detached inputs (model.py); it is exported with index_topk = --index-topk (default = --seq,
so within the trained context the top-k keeps every key and hyserve's sparse attention equals the
dense attention the model was trained with; beyond it the indexer chooses). The last
--fake-quant-frac of the steps run the routed experts on MXFP4-rounded weights (straight-through),
so the exported MXFP4 experts are the weights the model finished training with.

Held-out perplexity: every non-overlapping --seq window of the held-out split, every position
scored, exp(mean negative log-likelihood). Measured on the trained model (fp32, dense) before the
fake-quant phase, at the end, and on the EXPORTED checkpoint loaded back (bf16 weights, MXFP4
experts, the indexer's top-k: hyserve's math); plus the export with a top-k of --seq / 8, to show
what the indexer has learnt.

Deterministic given --seed on one machine: seeded init and sampling, torch's deterministic
algorithms (CUBLAS_WORKSPACE_CONFIG set before torch loads), no atomics-based reductions in the
model (experts combine densely). --time-limit-s is a safety net only: if training runs past it the
loop stops early (result.json says so) and still exports.
"""

import argparse
import json
import math
import os
import sys
import time

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import numpy as np  # noqa: E402
import torch  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import export as ex  # noqa: E402
from model import KimiK3, init_weights  # noqa: E402

MAX_SKIPPED_STEPS = 10
DEFAULT_TOKENS = os.path.join(ex.ROOT, ".cache", "tiny-k3-speaks", "tokens")


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--tokens", default=DEFAULT_TOKENS)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-steps", type=int, default=1500)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--bias-rate", type=float, default=1e-3)
    p.add_argument("--fake-quant-frac", type=float, default=0.2)
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--eval-every", type=int, default=250)
    p.add_argument("--eval-windows", type=int, default=0, help="held-out windows per evaluation (0: all)")
    p.add_argument("--time-limit-s", type=float, default=390.0)
    p.add_argument("--fit-steps-to-s", type=float, default=0.0,
                   help="time the first --fit-probe-steps steps and lower --max-steps so the loop ends within this "
                        "many seconds (0: off); result.json records the step count, and a rerun with that "
                        "--max-steps gives the same bits")
    p.add_argument("--fit-probe-steps", type=int, default=20)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--bf16", choices=("auto", "on", "off"), default="auto",
                   help="bf16 autocast (auto: on a GPU only; on: also on a CPU, to try the GPU's precision there)")
    # model size (tools/tiny_k3/export.py make_config)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--index-topk", type=int, default=0, help="0: --seq")
    return p.parse_args()


def load_tokens(folder, split):
    return torch.from_numpy(np.fromfile(os.path.join(folder, f"{split}.u16"), dtype="<u2").astype(np.int64))


def mla_layers(n):
    """K3's schedule scaled down: every 4th layer (0-based 3, 7, ...) and the last two are MLA."""
    return tuple(sorted({i for i in range(n) if i % 4 == 3} | {n - 2, n - 1}))


def lr_at(step, args):
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    progress = (step - args.warmup) / max(1, args.max_steps - args.warmup)
    return args.lr * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


def autocast(args):
    on = args.bf16 == "on" or (args.bf16 == "auto" and args.device.startswith("cuda"))
    return torch.autocast(torch.device(args.device).type, dtype=torch.bfloat16, enabled=on)


@torch.no_grad()
def heldout_ppl(model, tokens, args, sparse, windows=0):
    """exp(mean NLL) over non-overlapping --seq windows (every position scored)."""
    was_training = model.training
    model.eval()
    n = (len(tokens) - 1) // args.seq
    if windows:
        n = min(n, windows)
    total, count = 0.0, 0
    for start in range(0, n, args.batch):
        rows = range(start, min(n, start + args.batch))
        x = torch.stack([tokens[r * args.seq : r * args.seq + args.seq] for r in rows]).to(args.device)
        y = torch.stack([tokens[r * args.seq + 1 : r * args.seq + args.seq + 1] for r in rows]).to(args.device)
        with autocast(args):
            logits, _ = model(x, sparse=sparse)
        nll = torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1),
                                                reduction="sum")
        total += float(nll)
        count += y.numel()
    model.train(was_training)
    return math.exp(total / count), count


def main():
    args = parse_args()
    start_time = time.perf_counter()
    torch.manual_seed(args.seed)
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.benchmark = False
    torch.backends.cuda.matmul.allow_tf32 = True
    os.makedirs(args.out, exist_ok=True)
    curve = open(os.path.join(args.out, "loss_curve.jsonl"), "w")

    def log(obj):
        line = json.dumps(obj)
        print(line, flush=True)
        curve.write(line + "\n")
        curve.flush()

    train_tokens, heldout_tokens = load_tokens(args.tokens, "train"), load_tokens(args.tokens, "heldout")
    config = ex.make_config(hidden=args.hidden, layers=args.layers, mla_layers=mla_layers(args.layers),
                            index_topk=args.index_topk or args.seq)
    model = KimiK3(config)
    init_weights(model, torch.Generator().manual_seed(args.seed))
    model.to(args.device).train()
    num_params = sum(p.numel() for p in model.parameters())
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2 and "embed" not in n]
    no_decay = [p for n, p in model.named_parameters() if not (p.ndim >= 2 and "embed" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=args.lr, betas=(0.9, 0.95), eps=1e-8)
    sampler = torch.Generator().manual_seed(args.seed + 1)
    fake_quant_from = int(round(args.max_steps * (1 - args.fake_quant_frac)))
    log({"event": "start", "device": args.device, "params": num_params, "train_tokens": len(train_tokens),
         "heldout_tokens": len(heldout_tokens), "tokens_per_step": args.batch * args.seq,
         "fake_quant_from_step": fake_quant_from, "mla_layers": list(mla_layers(args.layers)),
         "startup_s": round(time.perf_counter() - start_time, 1)})

    if args.fit_steps_to_s > 0 and args.fit_probe_steps >= args.warmup:
        raise SystemExit("--fit-probe-steps must be below --warmup (the step count is chosen inside the warm-up)")
    result = {"seed": args.seed, "max_steps": args.max_steps, "params": num_params, "args": vars(args)}
    train_start = time.perf_counter()
    steps_done, stopped_early, skipped_steps = 0, False, 0
    for step in range(args.max_steps):
        if step == fake_quant_from:
            if fake_quant_from > 0:
                ppl, _ = heldout_ppl(model, heldout_tokens, args, sparse=False, windows=args.eval_windows)
                result["heldout_ppl_before_fake_quant"] = ppl
                log({"eval": "before_fake_quant", "step": step, "heldout_ppl": ppl})
            model.set_fake_quant(True)
        lr = lr_at(step, args)
        for group in opt.param_groups:
            group["lr"] = lr
        offsets = torch.randint(0, len(train_tokens) - args.seq - 1, (args.batch,), generator=sampler)
        window = torch.stack([train_tokens[o : o + args.seq + 1] for o in offsets.tolist()]).to(args.device)
        with autocast(args):
            logits, aux = model(window[:, :-1])
        ce = torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), window[:, 1:].reshape(-1))
        kl = aux.get("indexer_kl", torch.zeros((), device=args.device))
        opt.zero_grad(set_to_none=True)
        (ce + kl).backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        if not (torch.isfinite(ce) and torch.isfinite(grad_norm)):
            # A non-finite loss or gradient is a bug to find, not noise to train through: the
            # step is skipped (no update, no balancing) and said; a few in a row stop the run.
            skipped_steps += 1
            log({"event": "non_finite_step_skipped", "step": step + 1, "loss": float(ce), "grad_norm": float(grad_norm),
                 "skipped_so_far": skipped_steps})
            if skipped_steps > MAX_SKIPPED_STEPS:
                raise SystemExit(f"{skipped_steps} steps had a non-finite loss or gradient; stopping at step {step + 1}")
            opt.zero_grad(set_to_none=True)
            continue
        opt.step()
        with torch.no_grad():  # auxiliary-loss-free balancing
            for moe, load in zip(model.moe_layers(), aux["expert_load"]):
                moe.gate.e_score_correction_bias += args.bias_rate * torch.sign(load.mean() - load)
        steps_done = step + 1
        if args.fit_steps_to_s > 0 and steps_done == args.fit_probe_steps:
            # Decided inside the warm-up, whose learning rates do not depend on --max-steps, and
            # before the fake-quant phase: the run is the run `--max-steps N` would have made.
            if args.device.startswith("cuda"):
                torch.cuda.synchronize()
            elapsed = time.perf_counter() - train_start
            per_step = elapsed / steps_done
            fit = int((args.fit_steps_to_s - elapsed) / per_step) + steps_done
            fit = max(args.warmup + 10, fit - fit % 10)
            if fit < args.max_steps:
                args.max_steps = fit
                fake_quant_from = int(round(args.max_steps * (1 - args.fake_quant_frac)))
                result["max_steps"] = fit
            result["max_steps_fitted"] = {"probe_s_per_step": round(per_step, 4), "max_steps": args.max_steps}
            log({"event": "max_steps_fitted", "s_per_step": round(per_step, 4), "max_steps": args.max_steps,
                 "fake_quant_from_step": fake_quant_from})
        if step % args.log_every == 0 or steps_done == args.max_steps:
            imbalance = max(float(l.max() / l.mean()) for l in aux["expert_load"])
            log({"step": steps_done, "loss": round(ce.item(), 5), "indexer_kl": round(float(kl.detach()), 5),
                 "lr": round(lr, 7), "grad_norm": round(float(grad_norm), 4), "max_expert_load_over_mean": round(imbalance, 3),
                 "fake_quant": step >= fake_quant_from, "elapsed_s": round(time.perf_counter() - train_start, 1)})
        if args.eval_every and steps_done % args.eval_every == 0 and steps_done < args.max_steps:
            ppl, _ = heldout_ppl(model, heldout_tokens, args, sparse=False, windows=args.eval_windows)
            log({"eval": "periodic", "step": steps_done, "heldout_ppl": ppl})
        if time.perf_counter() - train_start > args.time_limit_s and steps_done < args.max_steps:
            stopped_early = True
            log({"event": "time_limit", "step": steps_done})
            break
        if steps_done >= args.max_steps:  # lowered by --fit-steps-to-s
            break
    train_s = time.perf_counter() - train_start
    result.update(steps_done=steps_done, stopped_early_by_time_limit=stopped_early, train_s=round(train_s, 1),
                  non_finite_steps_skipped=skipped_steps)

    ppl, n = heldout_ppl(model, heldout_tokens, args, sparse=False, windows=args.eval_windows)
    result.update(heldout_ppl_trained_fp32=ppl, heldout_scored_tokens=n)
    log({"eval": "final_trained_fp32", "step": steps_done, "heldout_ppl": ppl, "fake_quant": model.moe_layers()[0].fake_quant_experts})

    folder = os.path.join(args.out, "tiny-k3-speaks")
    model.cpu()
    ex.export_checkpoint(model, folder)
    exported = KimiK3(config)
    ex.load_checkpoint(exported, folder)
    exported.to(args.device)
    ppl, _ = heldout_ppl(exported, heldout_tokens, args, sparse=True, windows=args.eval_windows)
    result["heldout_ppl_exported"] = ppl
    log({"eval": "exported (bf16, MXFP4 experts, indexer top-k)", "heldout_ppl": ppl,
         "index_topk": config["text_config"]["dsa_config"]["index_topk"]})
    small = max(1, args.seq // 8)
    for m in exported.modules():
        if hasattr(m, "topk"):
            m.topk = small
    ppl_small, _ = heldout_ppl(exported, heldout_tokens, args, sparse=True, windows=args.eval_windows)
    result[f"heldout_ppl_exported_index_topk_{small}"] = ppl_small
    log({"eval": f"exported with index_topk {small} (indexer quality)", "heldout_ppl": ppl_small})
    result["bits_per_byte_exported"] = None
    manifest = os.path.join(args.tokens, "manifest.json")
    if os.path.exists(manifest) and not args.eval_windows:
        with open(manifest) as f:
            info = json.load(f)
        heldout_bytes = info.get("heldout", {}).get("bytes")
        if heldout_bytes:
            result["bits_per_byte_exported"] = math.log2(result["heldout_ppl_exported"]) * info["heldout"]["tokens"] / heldout_bytes
    result["total_s"] = round(time.perf_counter() - start_time, 1)
    result["config"] = config["text_config"]
    ex.write_json(os.path.join(args.out, "result.json"), result)
    log({"event": "done", "out": folder, "total_s": result["total_s"]})
    curve.close()


if __name__ == "__main__":
    main()

"""A trainer's side of RL with hyserve (issue 48): rollouts, scoring, and weights to the server.

    from hyserve_rl import HyserveRL
    server = HyserveRL("http://127.0.0.1:8000")
    rollouts = server.rollout(prompt_ids, max_tokens=64, temperature=1.0, seed=7)
    logprobs = server.score(prompt_ids, rollouts[0].token_ids)   # == rollouts[0].logprobs
    server.update_weights({"model.layers.0.mlp.down_proj.weight": tensor})   # the new policy
    server.load_lora_adapter("policy", "/ckpt/step-12", load_inplace=True)   # or an adapter

Standard library only (urllib); tensors may be torch tensors (torch when installed), numpy
arrays, or `RawTensor(dtype, shape, data)` for any safetensors dtype ("BF16" included, which
numpy lacks). It speaks the server's vLLM-compatible routes: /v1/completions (token ids in, token
ids and log-probs out), the development routes of `VLLM_SERVER_DEV_MODE=1` (/pause, /resume,
/sleep, /wake_up, /reset_prefix_cache, /start_weight_update, /update_weights with a folder,
/finish_weight_update) and the LoRA routes of `VLLM_ALLOW_RUNTIME_LORA_UPDATING=true`.

Weights go through a folder: `update_weights` writes the given tensors as one safetensors file
(names and dtypes as the checkpoint's: the server refuses another dtype or shape, naming the
tensor) and asks the server to load it in place; the tensors not given keep their values. For
a broadcast over a process group instead (Gloo on CPUs, NCCL on GPUs), `hyserve send-weights`
is the trainer side (a torch process group cannot join hyserve's rendezvous).

With the server started with `--batch-invariant`, a rollout's log-probs equal `score`'s for the
same tokens bit for bit (the RL mismatch is 0).
"""

import json
import os
import struct
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field

# numpy / torch dtype names -> safetensors dtype names
_NUMPY_DTYPES = {"float64": "F64", "float32": "F32", "float16": "F16", "int64": "I64",
                 "int32": "I32", "int16": "I16", "int8": "I8", "uint8": "U8", "bool": "BOOL"}
_TORCH_DTYPES = {"torch.float64": "F64", "torch.float32": "F32", "torch.float16": "F16",
                 "torch.bfloat16": "BF16", "torch.float8_e4m3fn": "F8_E4M3",
                 "torch.float8_e5m2": "F8_E5M2", "torch.int64": "I64", "torch.int32": "I32",
                 "torch.int16": "I16", "torch.int8": "I8", "torch.uint8": "U8", "torch.bool": "BOOL"}
_DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1, "I64": 8,
                "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}


class HyserveError(RuntimeError):
    """The server's answer to a refused call: its HTTP status and OpenAI error message."""

    def __init__(self, status, message, body=None):
        super().__init__(f"HTTP {status}: {message}")
        self.status = status
        self.message = message
        self.body = body


@dataclass
class RawTensor:
    """A tensor as safetensors stores it: dtype name ("BF16", "F32", ...), shape, little-endian
    bytes."""
    dtype: str
    shape: list
    data: bytes

    def __post_init__(self):
        if self.dtype not in _DTYPE_BYTES:
            raise ValueError(f"unknown safetensors dtype {self.dtype!r}")
        n = 1
        for d in self.shape:
            n *= int(d)
        if len(self.data) != n * _DTYPE_BYTES[self.dtype]:
            raise ValueError(f"{len(self.data)} bytes for a {self.dtype} tensor of shape {self.shape}")


def raw_tensor(value):
    """A RawTensor of a torch tensor, a numpy array or a RawTensor."""
    if isinstance(value, RawTensor):
        return value
    if type(value).__module__.startswith("torch"):
        dtype = _TORCH_DTYPES.get(str(value.dtype))
        if dtype is None:
            raise ValueError(f"torch dtype {value.dtype} has no safetensors name")
        t = value.detach().to("cpu").contiguous()
        width = _DTYPE_BYTES[dtype]
        import torch  # noqa: PLC0415 - only when torch tensors are given
        as_bytes = t.view(torch.uint8) if width == 1 else t.view(
            {2: torch.int16, 4: torch.int32, 8: torch.int64}[width])
        return RawTensor(dtype, list(t.shape), as_bytes.numpy().tobytes())
    if hasattr(value, "dtype") and hasattr(value, "tobytes"):
        dtype = _NUMPY_DTYPES.get(str(value.dtype))
        if dtype is None:
            raise ValueError(f"numpy dtype {value.dtype} has no safetensors name (use RawTensor)")
        little = value.astype(value.dtype.newbyteorder("<"), copy=False)
        return RawTensor(dtype, list(value.shape), little.tobytes(order="C"))
    raise TypeError(f"not a tensor: {type(value).__name__}")


def write_safetensors(path, tensors):
    """Writes {name: tensor} as one safetensors file (header padded to 8 bytes)."""
    header, blobs, offset = {}, [], 0
    for name in sorted(tensors):
        t = raw_tensor(tensors[name])
        header[name] = {"dtype": t.dtype, "shape": [int(d) for d in t.shape],
                        "data_offsets": [offset, offset + len(t.data)]}
        blobs.append(t.data)
        offset += len(t.data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


@dataclass
class Rollout:
    token_ids: list
    logprobs: list
    finish_reason: str = ""
    text: str = ""
    extra: dict = field(default_factory=dict)


class HyserveRL:
    def __init__(self, base_url, api_key=None, timeout=600.0):
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        self.timeout = timeout
        self._model = None

    # ---- HTTP ----
    def _call(self, method, route, body=None, params=None):
        url = self.base_url + route
        if params:
            url += "?" + urllib.parse.urlencode(params, doseq=True)
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(url, data=data, method=method)
        if data is not None:
            req.add_header("Content-Type", "application/json")
        if self.api_key:
            req.add_header("Authorization", f"Bearer {self.api_key}")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as r:
                raw = r.read()
        except urllib.error.HTTPError as e:
            raw = e.read()
            try:
                err = json.loads(raw)
                message = err.get("error", {}).get("message") or err.get("message") or raw.decode()
            except (ValueError, AttributeError):
                err, message = None, raw.decode(errors="replace")
            raise HyserveError(e.code, message, err) from None
        if not raw.strip():
            return {}
        try:
            return json.loads(raw)
        except ValueError:  # vLLM's LoRA routes answer in plain text
            return {"text": raw.decode(errors="replace")}

    def model(self):
        """The served base model's id (the first of /v1/models)."""
        if self._model is None:
            self._model = self._call("GET", "/v1/models")["data"][0]["id"]
        return self._model

    # ---- rollouts and scoring ----
    def rollout(self, prompt_ids, max_tokens, temperature=1.0, top_p=1.0, seed=None, n=1,
                model=None, **extra):
        """n sampled continuations of prompt_ids: each one's token ids and their log-probs."""
        body = {"model": model or self.model(), "prompt": [int(t) for t in prompt_ids],
                "max_tokens": int(max_tokens), "temperature": temperature, "top_p": top_p,
                "n": n, "logprobs": 0, "return_token_ids": True, **extra}
        if seed is not None:
            body["seed"] = int(seed)
        out = self._call("POST", "/v1/completions", body)
        rollouts = []
        for choice in sorted(out["choices"], key=lambda c: c["index"]):
            rollouts.append(Rollout(token_ids=list(choice["token_ids"]),
                                    logprobs=list(choice["logprobs"]["token_logprobs"]),
                                    finish_reason=choice.get("finish_reason") or "",
                                    text=choice.get("text", "")))
        return rollouts

    def score(self, prompt_ids, completion_ids, model=None):
        """The log-prob of each completion token after prompt_ids + the tokens before it, in one
        prefill (echo, max_tokens 0): what a trainer compares with the rollout's."""
        ids = [int(t) for t in prompt_ids] + [int(t) for t in completion_ids]
        out = self._call("POST", "/v1/completions", {
            "model": model or self.model(), "prompt": ids, "max_tokens": 0, "echo": True,
            "logprobs": 0, "temperature": 0})
        lp = out["choices"][0]["logprobs"]["token_logprobs"]
        if len(lp) != len(ids):
            raise HyserveError(200, f"{len(lp)} echoed log-probs for {len(ids)} tokens", out)
        return lp[len(prompt_ids):]

    # ---- generation control (VLLM_SERVER_DEV_MODE=1) ----
    def pause(self, mode="abort", clear_cache=True):
        return self._call("POST", "/pause", params={"mode": mode,
                                                    "clear_cache": str(bool(clear_cache)).lower()})

    def resume(self):
        return self._call("POST", "/resume")

    def is_paused(self):
        return self._call("GET", "/is_paused")["is_paused"]

    def sleep(self, level=1, mode="wait"):
        return self._call("POST", "/sleep", params={"level": level, "mode": mode})

    def wake_up(self, tags=None):
        return self._call("POST", "/wake_up", params={"tags": list(tags)} if tags else None)

    def is_sleeping(self):
        return self._call("GET", "/is_sleeping")["is_sleeping"]

    def reset_prefix_cache(self):
        return self._call("POST", "/reset_prefix_cache")

    # ---- weights ----
    def update_weights_from_folder(self, path):
        """Loads every tensor of a safetensors folder in place of the running weights."""
        self._call("POST", "/start_weight_update")
        self._call("POST", "/update_weights", {"update_info": {"weights_path": os.fspath(path)}})
        return self._call("POST", "/finish_weight_update")

    def update_weights(self, tensors, folder=None):
        """{checkpoint tensor name: tensor} in place of the running weights (the others keep
        theirs); returns the server's answer (num_tensors, weights_generation). The tensors are
        written into `folder` (a temporary one, removed after, by default), which the server must
        be able to read."""
        if not tensors:
            raise ValueError("no tensors to update")
        if folder is not None:
            os.makedirs(folder, exist_ok=True)
            write_safetensors(os.path.join(folder, "model.safetensors"), tensors)
            return self.update_weights_from_folder(folder)
        with tempfile.TemporaryDirectory(prefix="hyserve_rl_") as tmp:
            write_safetensors(os.path.join(tmp, "model.safetensors"), tensors)
            return self.update_weights_from_folder(tmp)

    # ---- LoRA (VLLM_ALLOW_RUNTIME_LORA_UPDATING=true) ----
    def load_lora_adapter(self, name, path, load_inplace=False):
        return self._call("POST", "/v1/load_lora_adapter", {
            "lora_name": name, "lora_path": os.fspath(path), "load_inplace": bool(load_inplace)})

    def unload_lora_adapter(self, name):
        return self._call("POST", "/v1/unload_lora_adapter", {"lora_name": name})

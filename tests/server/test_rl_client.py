"""tools/hyserve_rl.py, the trainer's side of RL (issue 48), against `hyserve serve`
--batch-invariant with the development routes: rollouts scored back with KL exactly 0 (base
model and a LoRA policy loaded through it), weights updated in place from tensors given as
bytes (a changed tensor changes the outputs, the original bytes bring them back bit for bit),
a tensor of the wrong dtype refused naming it, and the pause / sleep / prefix-cache calls."""

import json
import struct
import sys

import pytest

from conftest import MODEL_DIR, REPO_ROOT, start_server
from test_lora import write_adapter

sys.path.insert(0, str(REPO_ROOT / "tools"))
from hyserve_rl import HyserveError, HyserveRL, RawTensor  # noqa: E402

pytestmark = [pytest.mark.server]

PROMPT = [7, 99, 1000, 5, 42, 600, 13, 8, 301, 77, 4, 250]
TENSOR = "language_model.model.layers.0.mlp.down_proj.weight"


@pytest.fixture(scope="module")
def rl(tmp_path_factory):
    srv = start_server(tmp_path_factory.mktemp("rl_client"),
                       ["--batch-invariant", "--enable-sleep-mode", "--enable-lora",
                        "--max-lora-rank", "8"],
                       env={"VLLM_SERVER_DEV_MODE": "1", "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"})
    yield srv, HyserveRL(srv.base_url)
    srv.stop()


def read_tensor(name):
    raw = (MODEL_DIR / "model.safetensors").read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    info = json.loads(raw[8:8 + n])[name]
    begin, end = info["data_offsets"]
    return RawTensor(info["dtype"], info["shape"], raw[8 + n + begin:8 + n + end])


def assert_kl_zero(client, model=None):
    rollouts = client.rollout(PROMPT, max_tokens=12, temperature=1.0, seed=3, n=3, model=model,
                              ignore_eos=True)
    assert len(rollouts) == 3
    for r in rollouts:
        assert len(r.token_ids) == len(r.logprobs) == 12
        scored = client.score(PROMPT, r.token_ids, model=model)
        assert scored == r.logprobs  # bit for bit: KL == 0
    return rollouts


def test_rollouts_score_back_exactly(rl):
    _, client = rl
    assert_kl_zero(client)


def test_lora_policy_rollouts_score_back_exactly(rl, tmp_path):
    _, client = rl
    client.load_lora_adapter("policy", write_adapter(tmp_path / "policy", 5))
    base = client.rollout(PROMPT, max_tokens=12, temperature=0.0, ignore_eos=True)[0]
    policy = assert_kl_zero(client, model="policy")
    greedy = client.rollout(PROMPT, max_tokens=12, temperature=0.0, model="policy",
                            ignore_eos=True)[0]
    assert greedy.logprobs != base.logprobs  # the adapter is applied
    # A new policy in place under the same name.
    client.load_lora_adapter("policy", write_adapter(tmp_path / "policy2", 6), load_inplace=True)
    assert_kl_zero(client, model="policy")
    client.unload_lora_adapter("policy")
    with pytest.raises(HyserveError) as e:
        client.rollout(PROMPT, max_tokens=2, model="policy")
    assert e.value.status == 404
    assert policy


def test_weight_updates_in_place_and_back(rl):
    _, client = rl
    before = client.rollout(PROMPT, max_tokens=12, temperature=0.0, ignore_eos=True)[0]
    original = read_tensor(TENSOR)
    assert original.dtype == "BF16"
    changed = bytearray(original.data)
    for i in range(1, len(changed), 2):
        changed[i] ^= 0x01  # every value's exponent's lowest bit: a big change
    answer = client.update_weights({TENSOR: RawTensor("BF16", original.shape, bytes(changed))})
    assert answer["num_tensors"] == 1
    first_generation = answer["weights_generation"]
    after = client.rollout(PROMPT, max_tokens=12, temperature=0.0, ignore_eos=True)[0]
    assert after.logprobs != before.logprobs
    assert_kl_zero(client)  # still exact on the new weights
    answer = client.update_weights({TENSOR: original})
    assert answer["weights_generation"] > first_generation
    back = client.rollout(PROMPT, max_tokens=12, temperature=0.0, ignore_eos=True)[0]
    assert back.token_ids == before.token_ids and back.logprobs == before.logprobs


def test_a_tensor_of_another_dtype_is_refused_naming_it(rl):
    _, client = rl
    original = read_tensor(TENSOR)
    n = len(original.data) // 2
    with pytest.raises(HyserveError) as e:
        client.update_weights({TENSOR: RawTensor("F32", original.shape, bytes(4 * n))})
    assert e.value.status == 400
    assert TENSOR in e.value.message


def test_pause_sleep_and_prefix_cache(rl):
    _, client = rl
    client.pause(mode="keep")
    assert client.is_paused()
    client.resume()
    assert not client.is_paused()
    client.sleep(level=1)
    assert client.is_sleeping()
    client.wake_up()
    assert not client.is_sleeping()
    client.reset_prefix_cache()
    assert_kl_zero(client)


def test_numpy_tensors_are_written_as_safetensors(tmp_path):
    import numpy as np
    from hyserve_rl import write_safetensors
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    write_safetensors(tmp_path / "x.safetensors", {"a": a, "b": RawTensor("BF16", [2], b"\x80?\x00@")})
    raw = (tmp_path / "x.safetensors").read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    assert n % 8 == 0
    header = json.loads(raw[8:8 + n])
    assert header["a"] == {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]}
    assert header["b"] == {"dtype": "BF16", "shape": [2], "data_offsets": [24, 28]}
    assert raw[8 + n:8 + n + 24] == a.tobytes()
    with pytest.raises(ValueError):
        RawTensor("BF16", [3], b"\x00\x00")

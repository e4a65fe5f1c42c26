"""Weight pushes over the network, the parts that need no vLLM: the trainer's publisher (a real
HTTP server), the fetch and the checks the servers' worker extension makes before loading
(``turnrl.serving.vllm_worker``), and the address the servers reach the trainer at. The whole
path against a real vLLM server in its own mount namespace is in
``tests/train/test_http_train.py``."""

import hashlib

import httpx
import pytest
import torch
from safetensors.torch import save, save_file

from turnrl.policies.weight_push import WeightPublisher, reach_address
from turnrl.serving.vllm_worker import WeightPull, check_weights, checkpoint_shapes


def test_the_publisher_serves_the_latest_push_to_token_holders_only(tmp_path):
    first, second = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    first.write_bytes(b"first")
    second.write_bytes(b"second push")
    with WeightPublisher("127.0.0.1") as publisher:
        one = publisher.publish(first)
        assert one.size == 5 and one.sha256 == hashlib.sha256(b"first").hexdigest()
        auth = {"Authorization": f"Bearer {one.token}"}
        assert httpx.get(one.url, headers=auth).content == b"first"
        assert httpx.get(one.url).status_code == 401  # no token
        assert httpx.get(one.url, headers={"Authorization": "Bearer wrong"}).status_code == 401
        two = publisher.publish(second)
        assert httpx.get(two.url, headers=auth).content == b"second push"
        old = httpx.get(one.url, headers=auth)
        assert old.status_code == 410 and "newer push" in old.json()["error"]["message"]
        with pytest.raises(FileNotFoundError):
            publisher.publish(tmp_path / "missing")
    with pytest.raises(RuntimeError, match="not started"):
        publisher.publish(first)


def test_servers_on_loopback_are_reached_on_loopback():
    assert reach_address(["http://127.0.0.1:8000", "http://localhost:9"]) == "127.0.0.1"
    with pytest.raises(ValueError, match="no host"):
        reach_address(["8000"])


class _Worker(WeightPull):
    """The extension on a stand-in for vLLM's worker: ``reload_weights`` records what it got (the
    real one runs in ``tests/train/test_http_train.py``)."""

    def __init__(self, model_dir):
        self.vllm_config = type("C", (), {"model_config": type("M", (), {"model": str(model_dir)})()})()
        self.loaded = None

    def reload_weights(self, weights_iterator):
        self.loaded = dict(weights_iterator)


@pytest.fixture
def served(tmp_path):
    """A checkpoint folder (two tensors) and the worker serving it."""
    state = {"model.embed_tokens.weight": torch.randn(6, 4), "model.norm.weight": torch.ones(4)}
    (tmp_path / "model").mkdir()
    save_file(state, str(tmp_path / "model" / "model.safetensors"))
    return state, _Worker(tmp_path / "model")


def test_the_worker_loads_a_good_push_and_refuses_every_bad_one_before_loading(served, tmp_path):
    state, worker = served
    assert checkpoint_shapes(worker.vllm_config.model_config.model) == {"model.embed_tokens.weight": (6, 4),
                                                                         "model.norm.weight": (4,)}
    pushes = {
        "good": state,
        "tied head too": {**state, "lm_head.weight": state["model.embed_tokens.weight"].clone()},
        "nan": {**state, "model.norm.weight": torch.tensor([1.0, float("nan"), 1.0, 1.0])},
        "missing": {"model.norm.weight": state["model.norm.weight"]},
        "unknown": {**state, "model.extra.weight": torch.zeros(2)},
        "reshaped": {**state, "model.norm.weight": torch.ones(5)},
    }
    with WeightPublisher("127.0.0.1") as publisher:
        for name, push in pushes.items():
            worker.loaded = None
            data = save(push)
            file = tmp_path / f"{name}.safetensors"
            file.write_bytes(data)
            p = publisher.publish(file)
            report = worker.turnrl_pull_weights(p.url, p.token, p.sha256, str(p.size))
            if name in ("good", "tied head too"):
                assert report["ok"] and report["tensors"] == len(push) and report["bytes"] == len(data), report
                assert set(worker.loaded) == set(push)
            else:
                assert not report["ok"] and worker.loaded is None, (name, report)
                assert {"nan": "NaN or inf", "missing": "missing", "unknown": "unknown names",
                        "reshaped": "other shapes"}[name] in report["error"]
        p = publisher.publish(file)
        for args, says in (((p.url, p.token, "0" * 64, str(p.size)), "do not hash"),
                           ((p.url, "wrong", p.sha256, str(p.size)), "401"),
                           ((p.url, p.token, p.sha256, str(p.size - 1)), "more than the"),
                           ((p.url, p.token, p.sha256, str(p.size + 1)), "cut transfer"),
                           (("http://127.0.0.1:9/none", "", "", ""), "ConnectError"),
                           (("", "", "", ""), "")):
            report = worker.turnrl_pull_weights(*args)
            assert not report["ok"] and says in report["error"] and worker.loaded is None, (args, report)


def test_a_folder_the_server_cannot_see_is_answered_not_raised(served, tmp_path):
    state, worker = served
    report = worker.turnrl_load_folder(str(tmp_path / "elsewhere"))
    assert not report["ok"] and "not a folder holding *.safetensors files on the server" in report["error"]
    report = worker.turnrl_load_folder(worker.vllm_config.model_config.model)
    assert report["ok"] and set(worker.loaded) == set(state)


def test_check_weights_without_a_known_checkpoint_still_refuses_nan():
    assert check_weights({"w": torch.ones(2)}, None) is None
    assert "NaN" in check_weights({"w": torch.tensor([float("inf")])}, None)


def test_serve_policy_takes_pushes_over_http_and_answers_a_bad_one(tiny_model, tokenizer, tmp_path):
    """``turnrl serve-policy`` serves the same method as the vLLM extension: the client's probe
    passes, a good push is loaded, a NaN one is answered and changes nothing."""
    import copy

    from turnrl.policies.http import OpenAIPolicy, PolicyRequestError
    from turnrl.policies.server import PolicyServer
    from turnrl.policies.weights import save_weights

    served = copy.deepcopy(tiny_model)
    target = copy.deepcopy(tiny_model)
    with torch.no_grad():
        for p in target.parameters():
            p.add_(0.01)
    folder = save_weights(target.state_dict(), target.config, tmp_path / "push")
    bad = {n: t.clone() for n, t in target.state_dict().items()}
    bad["model.norm.weight"][0] = float("nan")
    save_file(bad, str(tmp_path / "bad.safetensors"))
    with PolicyServer(served, tokenizer) as server, WeightPublisher("127.0.0.1") as publisher:
        client = OpenAIPolicy(server.url, tokenizer=tokenizer, retries=0)
        client.check_weight_pull()  # the probe: an empty pull, answered
        p = publisher.publish(tmp_path / "bad.safetensors")
        with pytest.raises(PolicyRequestError, match="NaN or inf values.*keeps serving"):
            client.load_weights_from_url(p.url, token=p.token, sha256=p.sha256, size=p.size)
        assert torch.equal(served.model.norm.weight, tiny_model.model.norm.weight)  # unchanged
        p = publisher.publish(folder / "model.safetensors")
        report = client.load_weights_from_url(p.url, token=p.token, sha256=p.sha256, size=p.size)
        assert report["ok"] and report["bytes"] == p.size
        assert all(torch.equal(a, b) for a, b in zip(served.state_dict().values(), target.state_dict().values()))
        with pytest.raises(PolicyRequestError, match="not a folder holding"):
            client.load_weights_on_server(tmp_path / "missing")
        client.close()

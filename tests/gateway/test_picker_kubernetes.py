"""``kvgate picker --kubernetes``'s own checks, before it reaches a cluster."""

from __future__ import annotations

import pytest

from kvgate.gateway.picker_kubernetes import main


def test_an_inference_pool_group_kvgate_does_not_follow_is_refused_at_once(
        capsys: pytest.CaptureFixture[str]) -> None:
    # (the Inference Extension's pre-v1 pools, inference.networking.x-k8s.io/v1alpha2: kvgate would
    # follow v1 pools and never find this one)
    code = main(["--kubernetes", "--pool-name", "llama", "--pool-group", "inference.networking.x-k8s.io",
                 "--kube-api", "http://127.0.0.1:1"])
    assert code == 2
    assert "--pool-group inference.networking.x-k8s.io" in capsys.readouterr().out

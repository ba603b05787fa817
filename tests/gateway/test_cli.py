"""The ``kvgate`` command's dispatch: the Inference Extension picker's own command line (its image's
``args``, no subcommand) runs ``kvgate picker --kubernetes``, so kvgate's image can take its place in
its and llm-d's charts unchanged."""

from __future__ import annotations

import pytest

from kvgate.gateway import cli
from kvgate.gateway.cli import inference_extension_args

LLM_D_ARGS = [
    "--pool-name",
    "llama",
    "--pool-namespace",
    "default",
    "--pool-group",
    "inference.networking.k8s.io",
    "--zap-encoder",
    "json",
    "--config-file",
    "/config/default-plugins.yaml",
    "--tracing=false",
]
"""What llm-d's chart (config/charts/epplib) gives its picker image."""


def test_the_inference_extensions_command_line_is_the_picker_following_the_cluster() -> None:
    assert inference_extension_args(LLM_D_ARGS) == [
        "picker",
        "--kubernetes",
        "--host",
        "0.0.0.0",
        *LLM_D_ARGS,
    ]
    assert inference_extension_args(["--pool-name=llama", "--host=10.0.0.1"]) == [
        "picker",
        "--kubernetes",
        "--pool-name=llama",
        "--host=10.0.0.1",
    ]
    standalone = ["--endpoint-selector", "app=vllm", "--endpoint-target-ports", "8000", "--tracing=false"]
    assert inference_extension_args(standalone) == [
        "picker", "--kubernetes", "--host", "0.0.0.0", *standalone,
    ]
    assert inference_extension_args(["picker", "--pool-name", "x"]) is None  # kvgate's own
    assert inference_extension_args(["--help"]) is None
    assert inference_extension_args([]) is None


def test_main_runs_it_as_the_picker(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[list[str]] = []

    def run_picker(argv: list[str]) -> int:
        seen.append(list(argv))
        return 0

    monkeypatch.setattr(cli, "_run_picker", run_picker)
    assert cli.main(LLM_D_ARGS) == 0
    assert seen == [["--kubernetes", "--host", "0.0.0.0", *LLM_D_ARGS]]

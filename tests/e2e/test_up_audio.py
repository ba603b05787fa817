"""Speech to text through the gateway, end to end: ``kvgate up --sim 2`` (the bundled example and an
InferenceModelRewrite) through real Envoy, with OpenAI's SDK sending the audio as a multipart form
as it does to vLLM. The form's model routes the request, is checked (404 from the gateway for a
model the pool does not serve), and is rewritten in the form; a form without a model is served by
the replica's own; a stream arrives whole; a form that is not one is 400 in OpenAI's shape."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import shutil
from pathlib import Path

import aiohttp
import openai
import pytest

from kvgate.gateway.processes.envoy_process import free_port
from kvgate.gateway.up import KvgateUp
from kvgate.gateway.up_options import EXAMPLE_MODEL, UpOptions, bundled_example
from tests.e2e.test_up_routing import wait_ready

pytestmark = pytest.mark.e2e
SPEECH = (b"RIFF" + bytes(range(256)) * 250)[:64_000]  # two seconds of 16 kHz 16-bit PCM
REWRITE = f"""
apiVersion: inference.networking.x-k8s.io/v1alpha2
kind: InferenceModelRewrite
metadata: {{name: speech, namespace: default}}
spec:
  poolRef: {{name: llama}}
  rules:
    - matches: [{{model: {{value: whisper}}}}]
      targets: [{{modelRewrite: {EXAMPLE_MODEL}}}]
"""


async def test_speech_to_text_is_routed_on_the_forms_model(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    config = tmp_path / "config"
    shutil.copytree(bundled_example(), config)
    (config / "rewrite.yaml").write_text(REWRITE)
    up = KvgateUp(UpOptions(directory=config, port=free_port(), admin_port=0, sim=2,
                            sim_hosts_from="127.0.9.97", sim_time_scale=0.01))
    try:
        await up.start()
        await wait_ready(http, up, ["llama"])
        client = openai.AsyncOpenAI(base_url=f"{up.url}/v1", api_key="unused", max_retries=0)
        try:
            done = await client.audio.transcriptions.create(model=EXAMPLE_MODEL, file=("a.wav", SPEECH))
            assert done.text.strip()
            renamed = await client.audio.transcriptions.create(model="whisper", file=("a.wav", SPEECH))
            assert renamed.text.strip()  # the replicas serve only EXAMPLE_MODEL: the form was rewritten
            for _ in range(60):  # the gateway's own 404 once every replica's /v1/models is polled
                with pytest.raises(openai.NotFoundError) as refused:  # (until then the replica's)
                    await client.audio.transcriptions.create(model="no-such-model", file=("a.wav", SPEECH))
                if refused.value.code == "model_not_found":
                    break
                await asyncio.sleep(0.05)
            assert refused.value.code == "model_not_found"
        finally:
            await client.close()

        form = aiohttp.FormData()
        form.add_field("file", SPEECH, filename="a.wav", content_type="audio/wav")
        async with http.post(f"{up.url}/v1/audio/translations", data=form) as response:
            assert response.status == 200, await response.text()  # no model: the replica's own
            assert json.loads(await response.text())["usage"] == {"type": "duration", "seconds": 2}

        form = aiohttp.FormData()
        form.add_field("file", SPEECH, filename="a.wav", content_type="audio/wav")
        for name, value in (("model", "whisper"), ("stream", "true"), ("stream_include_usage", "true")):
            form.add_field(name, value)
        async with http.post(f"{up.url}/v1/audio/transcriptions", data=form) as response:
            assert response.status == 200
            events = [line[6:] for line in (await response.text()).split("\n\n") if line.startswith("data: ")]
        assert events[-1] == "[DONE]"
        chunks = [json.loads(event) for event in events[:-1]]
        assert {chunk["object"] for chunk in chunks} == {"transcription.chunk"}
        assert {chunk["model"] for chunk in chunks} == {"whisper"}  # the name asked for, as for a chat
        assert chunks[-1]["usage"]["completion_tokens"] == sum(
            1 for chunk in chunks if chunk["choices"] and chunk["choices"][0]["delta"].get("content"))

        not_a_form = {"content-type": "multipart/form-data; boundary=kvgate-not-a-form"}
        async with http.post(f"{up.url}/v1/audio/transcriptions", data=b"not a form",
                             headers=not_a_form) as response:
            assert response.status == 400
            assert (await response.json())["error"]["type"] == "invalid_request_error"
    finally:
        await up.stop()


async def test_a_long_recording_needs_a_larger_body_limit(http: aiohttp.ClientSession) -> None:
    """10 MB of audio (about five minutes) is over the gateway's default 8 MiB body limit (413 in
    OpenAI's JSON) and served with ``--max-request-body 12MiB``."""
    recording = bytes(range(256)) * 40_000  # 10,240,000 bytes
    for limit, status in ((None, 413), (12 * 1024 * 1024, 200)):
        options = UpOptions(port=free_port(), admin_port=0, sim=1, sim_hosts_from="127.0.9.191",
                            sim_time_scale=0.01)
        if limit is not None:
            options = dataclasses.replace(options, max_request_body=limit)
        up = KvgateUp(options)
        try:
            await up.start()
            await wait_ready(http, up, ["llama"])
            form = aiohttp.FormData()
            form.add_field("model", EXAMPLE_MODEL)
            form.add_field("file", recording, filename="long.wav", content_type="audio/wav")
            async with http.post(f"{up.url}/v1/audio/transcriptions", data=form) as response:
                assert response.status == status, await response.text()
                if status == 413:
                    assert (await response.json())["error"]["code"] == "payload_too_large"
        finally:
            await up.stop()

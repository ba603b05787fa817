#!/usr/bin/env bash
# The installed product stands alone (issue 17): build kvgate's wheel from this checkout, install
# it into a fresh virtual environment, and from a directory outside the checkout run every
# command's --help and `kvgate up` (its simulated fleet) until it serves a completion.
# Exit code: non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"
PY="${PYTHON:-python3}"
WORK="$(mktemp -d)"
UP_PID=""
cleanup() {
  if [ -n "$UP_PID" ]; then kill -TERM "$UP_PID" 2>/dev/null || true; wait "$UP_PID" 2>/dev/null || true; fi
  rm -rf "$WORK"
}
trap cleanup EXIT

quietly() {  # pip's output only when it fails
  "$@" >"$WORK/pip.log" 2>&1 || { cat "$WORK/pip.log" >&2; return 1; }
}
echo "== wheel: build"
# from a copy of the sources (setuptools writes build/ and *.egg-info beside what it builds)
mkdir "$WORK/src"
tar -C "$ROOT" --exclude=./.git --exclude=./.venv --exclude=./.dev --exclude=./build --exclude='*.egg-info' \
  --exclude=__pycache__ -cf - . | tar -C "$WORK/src" -xf -
quietly "$PY" -m pip wheel -q --no-deps -w "$WORK/dist" "$WORK/src"
echo "== wheel: install into a fresh virtual environment"
"$PY" -m venv "$WORK/venv"
quietly "$WORK/venv/bin/python" -m pip install -q --upgrade pip
quietly "$WORK/venv/bin/python" -m pip install -q "$WORK"/dist/kvgate-*.whl
mkdir "$WORK/elsewhere"
cd "$WORK/elsewhere"
echo "== wheel: one import namespace (kvgate.*), no generic top-level names"
"$WORK/venv/bin/python" - <<'PYCODE'
import importlib, importlib.util
for name in ("kvgate", "kvgate.gateway", "kvgate.extproc", "kvgate.policies", "kvgate.simulator",
             "kvgate.bench", "kvgate.proto.shared_state_pb2", "kvgate.gateway.cli"):
    importlib.import_module(name)
claimed = [name for name in ("gateway", "extproc", "policies", "simulator", "bench", "kvgate_proto")
           if importlib.util.find_spec(name) is not None]
assert not claimed, f"the wheel claims top-level names: {claimed}"
print("wheel: imports kvgate.* only")
PYCODE
for command in "" up picker sim bench status; do
  "$WORK/venv/bin/kvgate" $command --help >/dev/null
done
echo "== wheel: kvgate up serves a completion"
PORT="$("$WORK/venv/bin/python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
"$WORK/venv/bin/kvgate" up --port "$PORT" --admin-port 0 --sim 2 --sim-time-scale 0.01 \
  --sim-hosts-from 127.0.9.1 >"$WORK/up.log" 2>&1 &
UP_PID=$!
for _ in $(seq 1 600); do
  grep -q "kvgate ready" "$WORK/up.log" && break
  kill -0 "$UP_PID" 2>/dev/null || { cat "$WORK/up.log" >&2; echo "kvgate up exited" >&2; exit 1; }
  sleep 0.1
done
grep -q "kvgate ready" "$WORK/up.log" || { cat "$WORK/up.log" >&2; echo "kvgate up never got ready" >&2; exit 1; }
"$WORK/venv/bin/python" - "$PORT" <<'PYCODE'
import json, sys, urllib.request
port = sys.argv[1]
body = json.dumps({"model": "meta-llama/Llama-3.1-8B-Instruct", "prompt": "Say hello", "max_tokens": 4}).encode()
request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=body,
                                 headers={"content-type": "application/json"})
with urllib.request.urlopen(request, timeout=30) as response:
    answer = json.load(response)
assert answer["object"] == "text_completion", answer
with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=10) as response:
    assert json.load(response)["data"], "no models listed"
print("wheel: completion served from", answer["model"])
PYCODE

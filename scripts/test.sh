#!/usr/bin/env bash
# The README's test command. On a fresh machine it is the only set-up step:
#   1. installs what the tests drive for real and pip cannot give: redis-server (Debian package),
#      when it is missing and this user may install packages (root, or passwordless sudo);
#   2. creates .venv if missing and installs kvgate with its dev tools;
#   3. runs ruff, mypy --strict and pytest (unit tests, and end-to-end tests with the real Envoy
#      binary, the simulator and a real redis-server over loopback).
# Exit code: non-zero on any failure, pytest's "no tests collected" (exit 5) included.
# Arguments go to pytest (e.g. `bash scripts/test.sh -m "not e2e"`).
set -euo pipefail
cd "$(dirname "$0")/.."

install_debian_packages() {
  # Debian packages the tests drive for real. Nothing to do when they are on PATH already.
  local missing=()
  command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
  [ "${#missing[@]}" -eq 0 ] && return 0
  local sudo=""
  if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
      sudo="sudo -n"
    else
      echo "test: ${missing[*]} missing and this user cannot install packages;" \
        "install them (apt-get install ${missing[*]}) and run again" >&2
      return 1
    fi
  fi
  if ! command -v apt-get >/dev/null 2>&1; then
    echo "test: ${missing[*]} missing and there is no apt-get here; install them and run again" >&2
    return 1
  fi
  echo "test: installing ${missing[*]} (Debian packages)"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  # The package starts a system-wide service on 6379; the tests start their own on free ports.
  command -v redis-server >/dev/null 2>&1
}
install_debian_packages

PY="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip >/dev/null
.venv/bin/python -m pip install -q -e '.[dev]'
# xds-protos ships an older copy of opentelemetry/proto; whichever wheel pip installs last owns the
# files. The OTLP exporter (tracing) and the tests' OTLP receiver need opentelemetry-proto's own.
.venv/bin/python -m pip install -q --force-reinstall --no-deps \
  "opentelemetry-proto==$(.venv/bin/python -c 'import importlib.metadata as m; print(m.version("opentelemetry-proto"))')"
export PATH="$PWD/.venv/bin:$PATH"

echo "== ruff"; ruff check .
echo "== mypy --strict"; mypy
echo "== import layers"; lint-imports --no-cache
echo "== pytest"
set +e
pytest -q "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo "pytest collected no tests: that is a failure" >&2
  exit 1
fi
exit "$rc"

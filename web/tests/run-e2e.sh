#!/usr/bin/env bash
# End-to-end test of the viewer: installs what is missing (Debian's chromium, playwright-core
# from npm), starts `remat serve` on a free loopback port with a temporary plan store, runs
# web/tests/e2e.mjs against it in headless Chromium, and stops the server.
#
#   web/tests/run-e2e.sh            # against the real server: $REMAT_BIN, else
#                                   # $CARGO_TARGET_DIR/release/remat, else target/release/remat
#   web/tests/run-e2e.sh --mock     # against web/tests/mock-server.mjs (no Rust build needed)
#   web/tests/run-e2e.sh --live-web # the real server's API, but web/ served from disk through
#                                   # the mock server's proxy (the binary embeds web/ at build time)
#
# Screenshots and e2e-results.json go to web/tests/out/.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
mode=real
case "${1:-}" in
  --mock) mode=mock ;;
  --live-web) mode=live-web ;;
  "") ;;
  *) echo "usage: $0 [--mock | --live-web]" >&2; exit 2 ;;
esac

if ! command -v node >/dev/null; then
  echo "run-e2e: node (>= 18) is required" >&2
  exit 2
fi
if [[ ! -x /usr/bin/chromium ]]; then
  echo "run-e2e: installing chromium (apt-get)"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
fi
if [[ ! -d "$here/node_modules/playwright-core" || ! -d "$here/node_modules/axe-core" ]]; then
  echo "run-e2e: installing playwright-core and axe-core (npm ci)"
  (cd "$here" && npm ci --no-audit --no-fund --silent)
fi

port="$(node -e "const s=require('net').createServer().listen(0,'127.0.0.1',()=>{console.log(s.address().port);s.close()})")"
tmp="$(mktemp -d -t remat-e2e-XXXXXX)"
server_pid=""
proxy_pid=""
cleanup() {
  if [[ -n "$proxy_pid" ]] && kill -0 "$proxy_pid" 2>/dev/null; then
    kill "$proxy_pid" 2>/dev/null || true
  fi
  if [[ -n "$server_pid" ]] && kill -0 "$server_pid" 2>/dev/null; then
    kill "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
  fi
  rm -rf "$tmp"
}
trap cleanup EXIT INT TERM

if [[ "$mode" == mock ]]; then
  export E2E_VALIDATE="${E2E_VALIDATE:-1}"
  node "$here/mock-server.mjs" "$port" >"$tmp/server.log" 2>&1 &
  server_pid=$!
  ready_path=/
else
  bin="${REMAT_BIN:-${CARGO_TARGET_DIR:-$repo/target}/release/remat}"
  if [[ ! -x "$bin" ]]; then
    echo "run-e2e: no remat binary at $bin (build it with 'cargo build --release', set REMAT_BIN, or use --mock)" >&2
    exit 2
  fi
  # No token: the test posts without one.
  env -u REMAT_TOKEN "$bin" serve --addr "127.0.0.1:$port" --db "$tmp/remat.db" >"$tmp/server.log" 2>&1 &
  server_pid=$!
  ready_path=/healthz
fi

if [[ "$mode" == live-web ]]; then
  for _ in $(seq 1 120); do
    curl -fsS -o /dev/null "http://127.0.0.1:$port/healthz" 2>/dev/null && break
    sleep 0.5
  done
  api_port="$port"
  port="$(node -e "const s=require('net').createServer().listen(0,'127.0.0.1',()=>{console.log(s.address().port);s.close()})")"
  MOCK_PROXY="http://127.0.0.1:$api_port" node "$here/mock-server.mjs" "$port" >"$tmp/proxy.log" 2>&1 &
  proxy_pid=$!
fi

for _ in $(seq 1 120); do
  if curl -fsS -o /dev/null "http://127.0.0.1:$port$ready_path" 2>/dev/null; then break; fi
  if ! kill -0 "$server_pid" 2>/dev/null; then
    echo "run-e2e: the server exited:" >&2
    cat "$tmp/server.log" >&2
    exit 1
  fi
  sleep 0.5
done

echo "run-e2e: $mode server on http://127.0.0.1:$port"
status=0
REMAT_URL="http://127.0.0.1:$port" node "$here/e2e.mjs" || status=$?
if [[ $status -ne 0 ]]; then
  echo "run-e2e: server log (last 40 lines):" >&2
  tail -n 40 "$tmp/server.log" >&2
fi
exit $status

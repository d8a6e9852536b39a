#!/usr/bin/env bash
# A ComfyUI server on localhost with te-align's nodes installed, for looking at the nodes in a browser
# (the README's screenshot: tools/comfyui_screenshot.cjs).
#
#   COMFYUI_DIR=/path/to/ComfyUI PYTHON=/path/to/venv/bin/python tools/comfyui_server.sh start
#   tools/comfyui_server.sh screenshot docs/comfyui_nodes.png        # headless Chromium + playwright-core
#   tools/comfyui_server.sh screenshot docs/comfyui_node_error.png error   # the one-line message for a mistake
#   tools/comfyui_server.sh stop
#
# start: copies the checkout (without .git, output/, user/) to $WORK/ComfyUI so the checkout is not changed, installs
# the nodes there with `te-align comfyui install` (the user's command; te-align is imported from this repository),
# writes the demo model files (tools/comfyui_demo_models.py), and starts `main.py --cpu --listen 127.0.0.1` in the
# background, waiting until it answers. PYTHON must have ComfyUI's requirements and a torch/torchvision pair that
# load together (ComfyUI's server imports torchvision; a CUDA torchvision beside a CPU-only torch does not load).
#
# Environment: COMFYUI_DIR (start), PYTHON (default python3), PORT (default 8188),
# WORK (default ${XDG_CACHE_HOME:-$HOME/.cache}/te-align/comfyui-server), CHROMIUM (default chromium),
# NODE_PATH (a folder holding node_modules/playwright-core; default $WORK/node/node_modules, installed with npm).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
PORT="${PORT:-8188}"
WORK="${WORK:-${XDG_CACHE_HOME:-$HOME/.cache}/te-align/comfyui-server}"
URL="http://127.0.0.1:${PORT}"
PIDFILE="$WORK/server.pid"
LOG="$WORK/server.log"

running() { [[ -f "$PIDFILE" ]] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null; }

start() {
  : "${COMFYUI_DIR:?set COMFYUI_DIR to a ComfyUI checkout}"
  [[ -f "$COMFYUI_DIR/main.py" && -f "$COMFYUI_DIR/comfy/sd.py" ]] || { echo "$COMFYUI_DIR is not a ComfyUI checkout"; exit 2; }
  if running; then echo "already running (pid $(cat "$PIDFILE")) at $URL"; return 0; fi
  mkdir -p "$WORK"
  if [[ -d "$WORK/ComfyUI" ]]; then
    [[ -f "$WORK/ComfyUI/.te-align-copy" ]] || { echo "$WORK/ComfyUI exists and is not this script's copy"; exit 2; }
    rm -rf "$WORK/ComfyUI"
  fi
  mkdir -p "$WORK/ComfyUI"
  (cd "$COMFYUI_DIR" && tar cf - --exclude=./.git --exclude=./output --exclude=./user .) | (cd "$WORK/ComfyUI" && tar xf -)
  touch "$WORK/ComfyUI/.te-align-copy"
  PYTHONPATH="$REPO" "$PYTHON" -m te_align comfyui install "$WORK/ComfyUI"
  PYTHONPATH="$REPO" "$PYTHON" "$REPO/tools/comfyui_demo_models.py" "$WORK/ComfyUI/models"
  (
    cd "$WORK/ComfyUI"
    PYTHONPATH="$REPO" OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" \
      nohup "$PYTHON" main.py --cpu --listen 127.0.0.1 --port "$PORT" --disable-auto-launch </dev/null >"$LOG" 2>&1 &
    echo $! >"$PIDFILE"
  )
  for _ in $(seq 1 240); do
    if curl -sf -m 5 "$URL/system_stats" >/dev/null; then echo "ComfyUI at $URL (pid $(cat "$PIDFILE"), log $LOG)"; return 0; fi
    running || { echo "ComfyUI exited; last lines of $LOG:"; tail -n 30 "$LOG"; exit 1; }
    sleep 1
  done
  echo "ComfyUI did not answer at $URL within 240 s; last lines of $LOG:"; tail -n 30 "$LOG"; exit 1
}

stop() {
  if running; then
    kill "$(cat "$PIDFILE")"
    for _ in $(seq 1 30); do running || break; sleep 1; done
    echo "stopped"
  else
    echo "not running"
  fi
  rm -f "$PIDFILE"
}

screenshot() {
  local out="${1:?give the PNG to write}"
  running || { echo "not running: start it first"; exit 2; }
  local modules="${NODE_PATH:-$WORK/node/node_modules}"
  if [[ ! -d "$modules/playwright-core" ]]; then
    mkdir -p "$WORK/node"
    npm install --prefix "$WORK/node" --no-audit --no-fund playwright-core >/dev/null
    modules="$WORK/node/node_modules"
  fi
  NODE_PATH="$modules" node "$REPO/tools/comfyui_screenshot.cjs" "$URL" "$out" "${CHROMIUM:-chromium}" "${2:-}"
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  status) if running; then echo "running (pid $(cat "$PIDFILE")) at $URL"; else echo "not running"; fi ;;
  screenshot) shift; screenshot "$@" ;;
  *) echo "usage: tools/comfyui_server.sh start|stop|status|screenshot <out.png> [error]"; exit 2 ;;
esac

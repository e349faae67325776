#!/usr/bin/env bash
# A Spark standalone cluster on 127.0.0.1 from the pip-installed pyspark:
# one master and two workers (1 core, 1 GiB each by default).
#
#   scripts/cluster.sh up       # start; prints the master URL (also in $CLUSTER_DIR/master_url)
#   scripts/cluster.sh down     # stop the processes this script started (pid files)
#   scripts/cluster.sh status
#
# Environment: CLUSTER_DIR (default output/cluster: logs, pid files, work dirs),
# PYTHON (default .venv/bin/python; finds SPARK_HOME), WORKERS (2),
# WORKER_CORES (1), WORKER_MEMORY (1g), SPARK_WORKER_OPTS (extra -Dspark.worker.* settings,
# e.g. GPU resources). Ports are picked free; everything binds to 127.0.0.1.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
CLUSTER_DIR="${CLUSTER_DIR:-$ROOT/output/cluster}"
PYTHON="${PYTHON:-$ROOT/.venv/bin/python}"
WORKERS="${WORKERS:-2}"
WORKER_CORES="${WORKER_CORES:-1}"
WORKER_MEMORY="${WORKER_MEMORY:-1g}"
TIMEOUT_S="${TIMEOUT_S:-90}"

spark_home() {
  "$PYTHON" -c "import os, pyspark; print(os.path.dirname(pyspark.__file__))"
}

free_port() {
  "$PYTHON" -c "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1]); s.close()"
}

running() {  # pid file -> 0 when its process is alive
  [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null
}

up() {
  mkdir -p "$CLUSTER_DIR/logs" "$CLUSTER_DIR/pids"
  if running "$CLUSTER_DIR/pids/master.pid"; then
    echo "a cluster is already running: $(cat "$CLUSTER_DIR/master_url")" >&2
    return 1
  fi
  export SPARK_HOME="$(spark_home)"
  export SPARK_LOCAL_IP=127.0.0.1 SPARK_LOCAL_HOSTNAME=127.0.0.1 SPARK_MASTER_HOST=127.0.0.1
  export SPARK_DAEMON_MEMORY="${SPARK_DAEMON_MEMORY:-256m}"
  local class="$SPARK_HOME/bin/spark-class"
  [ -x "$class" ] || class="$(dirname "$PYTHON")/spark-class"
  local port webui
  port="$(free_port)"
  webui="$(free_port)"
  local url="spark://127.0.0.1:$port"

  nohup "$class" org.apache.spark.deploy.master.Master \
    --host 127.0.0.1 --port "$port" --webui-port "$webui" \
    >"$CLUSTER_DIR/logs/master.log" 2>&1 </dev/null &
  echo $! >"$CLUSTER_DIR/pids/master.pid"

  # The master's own URL from its log: the port picked above may have been taken meanwhile (another process's
  # ephemeral port), and the master then binds the next one.
  local deadline=$((SECONDS + TIMEOUT_S)) started=""
  while [ -z "$started" ]; do
    started="$(grep -o "Starting Spark master at spark://[^ ]*" "$CLUSTER_DIR/logs/master.log" 2>/dev/null | head -1 || true)"
    [ -n "$started" ] && break
    if ! running "$CLUSTER_DIR/pids/master.pid"; then
      echo "master exited; its log:" >&2
      tail -20 "$CLUSTER_DIR/logs/master.log" >&2
      return 1
    fi
    if [ "$SECONDS" -ge "$deadline" ]; then
      echo "timed out after ${TIMEOUT_S}s waiting for the master to start; logs in $CLUSTER_DIR/logs" >&2
      down >/dev/null
      return 1
    fi
    sleep 0.2
  done
  url="${started##* at }"

  for i in $(seq 1 "$WORKERS"); do
    mkdir -p "$CLUSTER_DIR/work-$i"
    nohup "$class" org.apache.spark.deploy.worker.Worker \
      --host 127.0.0.1 --port 0 --webui-port "$(free_port)" \
      --cores "$WORKER_CORES" --memory "$WORKER_MEMORY" --work-dir "$CLUSTER_DIR/work-$i" \
      "$url" >"$CLUSTER_DIR/logs/worker-$i.log" 2>&1 </dev/null &
    echo $! >"$CLUSTER_DIR/pids/worker-$i.pid"
  done
  echo "$url" >"$CLUSTER_DIR/master_url"
  echo "http://127.0.0.1:$webui" >"$CLUSTER_DIR/master_webui"

  while :; do
    local registered
    registered="$(grep -c "Registering worker" "$CLUSTER_DIR/logs/master.log" 2>/dev/null || true)"
    [ "${registered:-0}" -ge "$WORKERS" ] && break
    for f in "$CLUSTER_DIR"/pids/*.pid; do
      if ! running "$f"; then
        echo "$(basename "$f" .pid) exited; its log:" >&2
        tail -20 "$CLUSTER_DIR/logs/$(basename "$f" .pid).log" >&2
        down >/dev/null
        return 1
      fi
    done
    if [ "$SECONDS" -ge "$deadline" ]; then
      echo "timed out after ${TIMEOUT_S}s waiting for $WORKERS workers to register; logs in $CLUSTER_DIR/logs" >&2
      down >/dev/null
      return 1
    fi
    sleep 0.5
  done
  echo "$url"
}

down() {
  local pid f
  for f in "$CLUSTER_DIR"/pids/worker-*.pid "$CLUSTER_DIR"/pids/master.pid; do
    [ -f "$f" ] || continue
    pid="$(cat "$f")"
    if kill -0 "$pid" 2>/dev/null; then
      kill "$pid" 2>/dev/null || true
      for _ in $(seq 1 40); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
      kill -9 "$pid" 2>/dev/null || true
    fi
    rm -f "$f"
  done
  echo "stopped"
}

status() {
  local f any=1
  for f in "$CLUSTER_DIR"/pids/*.pid; do
    [ -f "$f" ] || continue
    if running "$f"; then echo "$(basename "$f" .pid): running (pid $(cat "$f"))"; any=0
    else echo "$(basename "$f" .pid): dead"; fi
  done
  [ -f "$CLUSTER_DIR/master_url" ] && echo "master: $(cat "$CLUSTER_DIR/master_url")"
  return $any
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  status) status ;;
  *) echo "usage: $0 up|down|status" >&2; exit 2 ;;
esac

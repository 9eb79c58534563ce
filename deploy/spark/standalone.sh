#!/usr/bin/env bash
# A one-machine Spark standalone cluster from the pip-installed PySpark, then a projection rebuild
# on it. The pip package has no start-master.sh/start-worker.sh; spark-daemon.sh does the same.
#
#   deploy/spark/standalone.sh up                      # master on spark://127.0.0.1:7077 + one worker
#   deploy/spark/standalone.sh rebuild account_balances [--config tributary.toml]
#   deploy/spark/standalone.sh down
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
SPARK_HOME=$("$PY" -c 'import pathlib, pyspark; print(pathlib.Path(pyspark.__file__).parent)')
export SPARK_HOME SPARK_LOCAL_IP=127.0.0.1 PYSPARK_PYTHON="$PWD/$PY"
export SPARK_PID_DIR=${SPARK_PID_DIR:-.tributary/spark/pids} SPARK_LOG_DIR=${SPARK_LOG_DIR:-.tributary/spark/logs}
export SPARK_WORKER_DIR=${SPARK_WORKER_DIR:-.tributary/spark/work}
MASTER_PORT=${MASTER_PORT:-7077}
MASTER=spark://127.0.0.1:$MASTER_PORT
daemon() { bash "$SPARK_HOME/sbin/spark-daemon.sh" "$@"; }

case "${1:-}" in
  up)
    mkdir -p "$SPARK_PID_DIR" "$SPARK_LOG_DIR" "$SPARK_WORKER_DIR"
    daemon start org.apache.spark.deploy.master.Master 1 --host 127.0.0.1 --port "$MASTER_PORT" --webui-port 8080
    daemon start org.apache.spark.deploy.worker.Worker 1 "$MASTER" --host 127.0.0.1 --cores "${WORKER_CORES:-2}" \
      --memory "${WORKER_MEMORY:-2g}" --webui-port 8081
    echo "$MASTER (UI http://127.0.0.1:8080)";;
  rebuild)
    shift
    name=${1:?usage: standalone.sh rebuild NAME [tributary options]}; shift
    # The project must be importable by the executors: it is installed in the same venv.
    TRIBUTARY_PROJECTIONS__SPARK_MASTER="$MASTER" .venv/bin/tributary project rebuild "$name" "$@";;
  down)
    daemon stop org.apache.spark.deploy.worker.Worker 1 || true
    daemon stop org.apache.spark.deploy.master.Master 1 || true;;
  *)
    echo "usage: $0 up | rebuild NAME [--config FILE] | down" >&2; exit 2;;
esac

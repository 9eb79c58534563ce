"""A Kafka cluster for tests: librdkafka's mock cluster, held by this process.

`python tests/kafka_mock.py [BROKERS]` loads the librdkafka bundled in the confluent-kafka wheel
(ctypes), starts a mock cluster, prints its bootstrap servers on one line and then reads
commands on stdin, one a line, answering `ok` or `error: …`:

    create TOPIC PARTITIONS [REPLICATION_FACTOR]

It lives until killed (or stdin closes). Any client, in any process, may use the bootstraps
meanwhile: transactions, read_committed consumers, consumer groups and committed offsets work;
AdminClient `create_topics`/`describe_configs` do not (they time out) — hence `create`.
"""

from __future__ import annotations

import ctypes
import glob
import os
import sys


def _library() -> ctypes.CDLL:
    import confluent_kafka

    libs = os.path.join(os.path.dirname(os.path.dirname(confluent_kafka.__file__)), "confluent_kafka.libs")
    found = sorted(glob.glob(os.path.join(libs, "librdkafka*.so*")))
    if not found:
        raise SystemExit(f"no bundled librdkafka under {libs}")
    lib = ctypes.CDLL(found[0])
    lib.rd_kafka_conf_new.restype = ctypes.c_void_p
    lib.rd_kafka_conf_set.argtypes = [
        ctypes.c_void_p,
        ctypes.c_char_p,
        ctypes.c_char_p,
        ctypes.c_char_p,
        ctypes.c_size_t,
    ]
    lib.rd_kafka_new.restype = ctypes.c_void_p
    lib.rd_kafka_new.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t]
    lib.rd_kafka_mock_cluster_new.restype = ctypes.c_void_p
    lib.rd_kafka_mock_cluster_new.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lib.rd_kafka_mock_cluster_bootstraps.restype = ctypes.c_char_p
    lib.rd_kafka_mock_cluster_bootstraps.argtypes = [ctypes.c_void_p]
    lib.rd_kafka_mock_topic_create.restype = ctypes.c_int
    lib.rd_kafka_mock_topic_create.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int, ctypes.c_int]
    lib.rd_kafka_err2str.restype = ctypes.c_char_p
    lib.rd_kafka_err2str.argtypes = [ctypes.c_int]
    return lib


def main() -> int:
    brokers = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    lib = _library()
    errstr = ctypes.create_string_buffer(512)
    conf = lib.rd_kafka_conf_new()
    lib.rd_kafka_conf_set(conf, b"log_level", b"3", errstr, len(errstr))  # no CONFWARN: it has no bootstraps
    rk = lib.rd_kafka_new(0, conf, errstr, len(errstr))  # a producer handle that owns the cluster
    if not rk:
        raise SystemExit(f"rd_kafka_new: {errstr.value.decode()}")
    mc = lib.rd_kafka_mock_cluster_new(rk, brokers)
    if not mc:
        raise SystemExit("rd_kafka_mock_cluster_new failed")
    print(lib.rd_kafka_mock_cluster_bootstraps(mc).decode(), flush=True)
    for line in sys.stdin:
        words = line.split()
        if not words:
            continue
        if words[0] == "create" and len(words) in (3, 4):
            rf = int(words[3]) if len(words) == 4 else min(brokers, 3)
            err = lib.rd_kafka_mock_topic_create(mc, words[1].encode(), int(words[2]), rf)
            print("ok" if err == 0 else f"error: {lib.rd_kafka_err2str(err).decode()}", flush=True)
        else:
            print(f"error: unknown command {line.strip()!r}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

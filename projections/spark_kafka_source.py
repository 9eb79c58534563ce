"""Kafka read by Spark's own Kafka source (`[projections] kafka_reader = "spark"`).

The driver plans as `kafka_source.KafkaSource` does (each partition's range [lo, hi): `lo` from the
checkpoints, `hi` the last stable offset); the records are then read by Spark's built-in source,
`spark.read.format("kafka")` (the `spark-sql-kafka-0-10` connector that `make setup` fetches into
build/spark-kafka/lib), given those ranges as `startingOffsets`/`endingOffsets` and
`kafka.isolation.level=read_committed`, so the executors' JVMs read Kafka and no Python step touches
a record until a projection's own Python needs it. Its binary key, value and headers become the
same text columns the Python reader gives (`source.RECORD_SCHEMA`, headers as the log's JSON object),
and a projection without its own key or event time gets them in SQL, as on the local log's Parquet
copies.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from tributary.log.kafka.codec import WHOLE_HEADERS
from tributary.log.kafka.options import KafkaOptions
from tributary.projections.errors import RunError
from tributary.projections.kafka_source import KafkaSource, offset_ranges
from tributary.projections.loader import resolve
from tributary.projections.source import (
    _ARROW,
    _RAW_SCHEMA,
    RECORD_SCHEMA,
    TP,
    _custom,
    _event_time,
    _not_schema,
    _reader,
)

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

    from tributary.projections.definition import Projection

__all__ = [
    "CONNECTOR_LIB",
    "SparkKafkaSource",
    "connector_jars",
    "java_client_options",
    "missing_connector",
    "offset_options",
    "spark_jar_dirs",
]

CONNECTOR_LIB = Path(__file__).resolve().parents[1] / "build" / "spark-kafka" / "lib"
FETCH_HINT = "run `make setup` (it fetches it as deploy/spark-kafka/pom.xml pins it)"
# `[log.kafka] client` settings that Kafka's Java client reads under the same name and meaning.
_JAVA_PREFIXES = ("security.", "sasl.", "ssl.", "client.")
# librdkafka's names without a Java twin of the same name (Java takes them in `sasl.jaas.config`).
_LIBRDKAFKA_ONLY = frozenset({"sasl.username", "sasl.password", "ssl.ca.location", "ssl.certificate.location"})
_SCRAM_LOGIN = "org.apache.kafka.common.security.scram.ScramLoginModule"
_PLAIN_LOGIN = "org.apache.kafka.common.security.plain.PlainLoginModule"


def connector_jars(lib: Path = CONNECTOR_LIB) -> list[str]:
    """The connector's jars in `lib` (none when it was not fetched), as `spark.jars` lists them."""
    return [str(p) for p in sorted(lib.glob("*.jar"))] if lib.is_dir() else []


def spark_jar_dirs() -> list[Path]:
    """Where Spark itself keeps its jars: PySpark's `jars` directory, and `$SPARK_HOME/jars`."""
    import os

    import pyspark

    dirs = [Path(pyspark.__file__).parent / "jars"]
    home = os.environ.get("SPARK_HOME")
    return [*dirs, Path(home) / "jars"] if home else dirs


def missing_connector(
    spark_conf: Mapping[str, str], lib: Path = CONNECTOR_LIB, spark_jars: Sequence[Path] = ()
) -> str | None:
    """Why a new session could not read with Spark's Kafka source (one line), or None: it is not in
    `lib`, nor among Spark's own jars (`spark_jars`: a Spark installed with the connector), nor
    named by `spark.jars.packages` or `spark.jars` in `spark_conf`."""
    named = spark_conf.get("spark.jars.packages", "") + "," + spark_conf.get("spark.jars", "")
    bundled = any(any(d.glob("spark-sql-kafka-0-10_*.jar")) for d in spark_jars if d.is_dir())
    if connector_jars(lib) or bundled or "spark-sql-kafka" in named:
        return None
    return (
        f'[projections] kafka_reader = "spark" needs Spark\'s Kafka source, not found in {lib}: {FETCH_HINT}, '
        'or set kafka_reader = "python"'
    )


def offset_options(ranges: Mapping[TP, tuple[int, int]]) -> dict[str, str]:
    """Spark's Kafka source options that read exactly offsets [lo, hi) of each topic-partition:
    `assign`, `startingOffsets`, `endingOffsets` (JSON, partitions as strings)."""
    assign: dict[str, list[int]] = {}
    start: dict[str, dict[str, int]] = {}
    end: dict[str, dict[str, int]] = {}
    for (topic, partition), (lo, hi) in sorted(ranges.items()):
        assign.setdefault(topic, []).append(partition)
        start.setdefault(topic, {})[str(partition)] = lo
        end.setdefault(topic, {})[str(partition)] = hi
    return {"assign": json.dumps(assign), "startingOffsets": json.dumps(start), "endingOffsets": json.dumps(end)}


def _jaas(client: Mapping[str, str]) -> str | None:
    """librdkafka's `sasl.username`/`sasl.password` (PLAIN, SCRAM) as the Java client's `sasl.jaas.config`."""
    user, password = client.get("sasl.username"), client.get("sasl.password")
    if user is None or password is None or "sasl.jaas.config" in client:
        return None
    mechanism = client.get("sasl.mechanism", client.get("sasl.mechanisms", "PLAIN")).upper()
    module = _SCRAM_LOGIN if mechanism.startswith("SCRAM") else _PLAIN_LOGIN
    return f'{module} required username="{_quoted(user)}" password="{_quoted(password)}";'


def _quoted(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"')


def java_client_options(options: KafkaOptions) -> dict[str, str]:
    """`[log.kafka]` as Spark's Kafka source options (`kafka.`-prefixed Java client settings): the
    bootstrap servers, the security settings Java names alike, the SASL login as a JAAS line."""
    client = dict(options.client)
    out = {"kafka.bootstrap.servers": options.bootstrap_servers}
    for key, value in client.items():
        if key.startswith(_JAVA_PREFIXES) and key not in _LIBRDKAFKA_ONLY:
            out["kafka." + ("sasl.mechanism" if key == "sasl.mechanisms" else key)] = value
    jaas = _jaas(client)
    if jaas is not None:
        out["kafka.sasl.jaas.config"] = jaas
    return out


def _json_text(expr: str) -> str:
    """SQL: the JSON text of the string `expr` (`null` for NULL), escaped as a JSON writer does."""
    return f"substr(to_json(array({expr})), 2, length(to_json(array({expr}))) - 2)"


def _headers_text() -> Column:
    """Kafka's headers (array of key/binary value) as the log's headers, as `codec.log_headers`
    gives them: NULL without headers, the one `tributary.headers` header's bytes whole, else a JSON
    object of the values as text."""
    from pyspark.sql import functions as F

    pair = f"concat({_json_text('h.key')}, ':', {_json_text('cast(h.value AS string)')})"
    return F.expr(
        "CASE WHEN headers IS NULL OR size(headers) = 0 THEN NULL "
        f"WHEN size(headers) = 1 AND headers[0].key = '{WHOLE_HEADERS}' AND headers[0].value IS NOT NULL "
        "THEN cast(headers[0].value AS string) "
        f"ELSE concat('{{', array_join(transform(headers, h -> {pair}), ','), '}}') END"
    )


def raw_columns(frame: DataFrame) -> DataFrame:
    """Spark's Kafka rows (binary key and value, a timestamp, header structs) as the log's seven
    record columns (`source._RAW_SCHEMA`): JSON as text, the timestamp in epoch milliseconds."""
    from pyspark.sql import functions as F

    return frame.select(
        "topic",
        F.col("partition").cast("int").alias("partition"),
        F.col("offset").cast("long").alias("offset"),
        F.unix_millis("timestamp").alias("timestamp"),
        F.col("key").cast("string").alias("key"),
        F.col("value").cast("string").alias("value"),
        _headers_text().alias("headers"),
    )


def projection_frame(
    p: Projection, rows: DataFrame, *, modules: tuple[str, ...], mirror: tuple[str, ...], name: str
) -> DataFrame:
    """The seven record columns → `source.RECORD_SCHEMA` for `p` (+ `value_v` for a DataFrame
    projection): the log's key and event time in SQL, or the projection's own in Python."""
    from pyspark.sql import functions as F

    variant = p.build is not None
    if _custom(p):
        frame = rows.mapInArrow(_reader(modules, mirror, name, columns=True), RECORD_SCHEMA)
        return frame.withColumn("value_v", F.expr("try_parse_json(value)")) if variant else frame
    if not p.schema_records:
        rows = rows.where(_not_schema())
    rows = rows.withColumn("value_v", F.expr("try_parse_json(value)"))
    pkey = F.coalesce(F.col("key"), F.lit("null")).alias("pkey")
    out = rows.select(*_ARROW.names[:7], _event_time().alias("event_time"), pkey, "value_v")
    return out if variant else out.drop("value_v")


class SparkKafkaSource(KafkaSource):
    """`KafkaSource` whose records Spark's own Kafka source reads (the driver's planning is the same)."""

    def records_frame(
        self,
        spark: SparkSession,
        *,
        modules: Sequence[str],
        mirror: Sequence[str],
        name: str,
        topics: Sequence[str],
        lo: Mapping[TP, int],
        hi: Mapping[TP, int],
        max_bytes: int = 16 << 20,
    ) -> DataFrame:
        """The records of offsets [lo, hi) per topic-partition (`source.records_frame`'s schema),
        in about as many Spark tasks as the Python reader's ranges of `split_offsets`."""
        p = resolve(tuple(modules), tuple(mirror), name)
        pieces = offset_ranges(topics, lo, hi, self.split_offsets)
        if not pieces:
            rows = spark.createDataFrame([], _RAW_SCHEMA)
        else:
            ranges = {(t, part): (lo.get((t, part), 0), hi[(t, part)]) for t, part, _, _ in pieces}
            rows = raw_columns(self._load(spark, ranges, len(pieces)))
        return projection_frame(p, rows, modules=tuple(modules), mirror=tuple(mirror), name=name)

    def _load(self, spark: SparkSession, ranges: Mapping[TP, tuple[int, int]], tasks: int) -> DataFrame:
        """Spark's Kafka source over `ranges`, read_committed, in at least `tasks` tasks; a session
        without the connector is told in one line."""
        from pyspark.errors import AnalysisException

        reader = (
            spark.read.format("kafka")
            .options(**java_client_options(self.opts))
            .options(**offset_options(ranges))
            .option("kafka.isolation.level", "read_committed")
            .option("includeHeaders", "true")
            # a range below the partition's start (retention) reads from the start, as the Python reader does
            .option("failOnDataLoss", "false")
            .option("minPartitions", str(tasks))
        )
        try:
            return reader.load()
        except AnalysisException as exc:
            if "DATA_SOURCE_NOT_FOUND" in str(exc) or "Failed to find data source: kafka" in str(exc):
                raise RunError(
                    "this Spark session has no Kafka source (spark-sql-kafka-0-10) for "
                    f'[projections] kafka_reader = "spark": {FETCH_HINT}, then start again'
                ) from None
            raise

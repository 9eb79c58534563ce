"""The log on Kafka (`[log] backend = "kafka"`, docs/kafka.md): capture's transactional writer
(`writer`), the readers of its topics and offsets topic (`read`), how records map onto messages
(`codec`), the `[log.kafka]` options (`options`) and the clients' shared settings (`clients`).

Only `writer` and `read` import confluent-kafka: the settings and the CLI import the options alone.
"""

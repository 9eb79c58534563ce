"""A local Apache Kafka (KRaft mode, the broker's own jars) for development and the tests."""

from tributary.api.devkafka.embedded import DEFAULT_LIB_DIR, BrokerError, EmbeddedKafka

__all__ = ["DEFAULT_LIB_DIR", "BrokerError", "EmbeddedKafka"]

"""Kafka's record format: the v2 batch codec (headers, records, columns), varints,
compression codecs, legacy message sets (v0/v1), control records and the schema reader of Kafka's
own message types."""

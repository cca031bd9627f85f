"""Kafka's own topics, read and decoded: the KRaft metadata log (topic configs, its records),
`__consumer_offsets` and `__transaction_state`."""

"""Log compaction, as Kafka's LogCleaner does it: the offset map, which partitions to clean and
how far, and the cleaner that writes the cleaned segments."""

"""One partition's log, as Kafka's storage layer keeps it: segment files and their offset, time
and transaction indexes, the segment map, the loader and recovery, the log itself, retention,
file naming, the descriptor budget, and the files kept beside the segments (checkpoints, leader
epochs, producer snapshots)."""

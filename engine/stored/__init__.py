"""Data dirs backed up in object storage, read where they are (see engine.stored.local_copy)."""

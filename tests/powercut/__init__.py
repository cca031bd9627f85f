"""Power-cut tests: the engine on a FUSE passthrough that knows what a power cut keeps."""

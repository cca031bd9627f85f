"""The `seglogfs` command line and mount helpers. Nothing imports this package."""

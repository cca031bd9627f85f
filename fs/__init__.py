"""The FUSE layer (pyfuse3 + trio): the tree of topics, partitions and views, and the adapter
that serves it. It arrives with the mount; today this package is the place it will live."""

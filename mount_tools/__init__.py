"""The `seglogfs` command line and mount helpers. Nothing imports this package."""

import os

# numpy's OpenBLAS starts a thread per core that spins for a while after start-up. seglogfs does
# no linear algebra, and on a small machine those threads take CPU from the work (measured: 13 %
# of the CPU time of a `consume` of 1 GiB on two cores). Set before numpy is first imported; a
# value the user set stays.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

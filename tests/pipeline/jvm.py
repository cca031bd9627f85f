"""The JVM options of the tests' Spark applications (the driver's, and the executors' of a
cluster): C1 only and one collector thread. A test's queries are short and small, and C2's
compiler threads and G1's workers were a third of the CPU a test module's JVM used on two cores.
The benchmarks (bench/) run Spark as it comes."""

TEST_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"

"""What ``dsv41-kernels check``, the tests and the benchmarks hold the ops to: one module per op
with its check cases, example inputs and accuracy measures (:mod:`.common`: the case type and
the bitwise comparison). Nothing under ``ops/`` imports these; they import the ops."""

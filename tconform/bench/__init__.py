"""`tconform bench`: latency of every engine on chosen cases and shapes, against the machine's
measured matrix-multiply ceiling (flops, ceiling, timing, engines, report, compare)."""

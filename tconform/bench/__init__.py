"""`tconform bench`: latency of every engine on chosen cases and shapes, or on a user's model at
its input sets, against the machine's measured matrix-multiply ceiling and memory floor.

An engine is what a bench times: a runtime on one graph variant of the export (ONNX Runtime
plain, sdpa, optimizer-fused, float16, bfloat16, int8 or int4, with or without IO binding;
OpenVINO at bfloat16), or a module runtime (torch eager, torch.compile, torch's dynamic int8,
bfloat16 autocast), or OpenVINO on the plain export. A workload is what every engine of a
group of rows runs: one case at one shape, or a user's model at one input set.

  run.py      one bench run, top to bottom (the settings, exports, ceilings, rows, summary)
  workload.py one case at one shape: inputs, float64 outputs, models, module, FLOP
  module.py   a user's model as workloads: its dtype cells and input sets (tconform check's)
  engines.py  the engines and their openers, through the execution layer
  fusions.py  the optimizer-fused graph variant
  measure.py  one row: time an engine, latency percentiles, FLOP/s against the ceiling
  weights.py  the weight bytes an engine reads (its memory floor), from what it holds
  accuracy.py a row's outputs judged against the float64 outputs under its precision's row
  timing.py   the timing loop, statistics and peak memory
  ceiling.py  the GEMM ceiling and the copy bandwidth (the memory floor)
  profile.py  ONNX Runtime's per-op profile
  summary.py  the best variant per case and shape
  report.py   table, markdown, JSON and plot of a run
  compare.py  `bench --compare A.json B.json`: ratios with a noise estimate
  generate.py `bench --generate N`: autoregressive decoding per token, with the cache and without
"""

"""Generation: the exported Transformer decoding autoregressively (doc 003, section 3.2).

steppers  one interface, "the next step's log-probabilities", over the oracle and every runtime
          (through the execution layer), with and without the cache
driver    greedy, beam search and top-k/top-p sampling, asking a stepper only for log-probs
verdict   token-exact comparison that tells a near-tie from a failure
golden    the generation goldens (golden-generation/) and their drift check

What runs them lives with the other checks and benches: `tconform verify --generation` is a
suite of the one pipeline (tconform.suites.generation), `tconform bench --generate N` a bench
(tconform.bench.generate).

The three models it runs (encoder, decoder step with a key/value cache, prefix decoder without
one) are registry cases: tconform.registry.GENERATION_CASES.
"""

"""Generation: the exported Transformer decoding autoregressively (doc 003, section 3.2).

models    the encoder, decoder-step (key/value cache) and prefix (no cache) models as cases
steppers  one interface, "the next step's log-probabilities", over the oracle, PyTorch and ONNX
          Runtime, with and without the cache
driver    greedy, beam search and top-k/top-p sampling, asking a stepper only for log-probs
verdict   token-exact comparison that tells a near-tie from a failure
golden    the generation goldens (golden-generation/) and their drift check
verify    `tconform verify --generation`
bench     `tconform bench --generate N`
"""

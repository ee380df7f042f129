"""Modules written outside tconform, to try `tconform check` on (see docs/check.md).

Each module here has a `make()` factory that returns (module, example_inputs):

    tconform check examples.torch_encoder:make
    tconform check examples.tiny_gpt:make --dynamic idx=0:batch,1:seq
"""

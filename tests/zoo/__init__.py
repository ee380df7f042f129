"""A zoo of small real models for `tconform check` (issue 21): factories in models.py, and a
helper that corrupts one module's weight in an exported ONNX model (corrupt.py)."""

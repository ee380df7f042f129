"""A user's PyTorch module, as the suite of `tconform check` (tconform.suites.module) uses it:
its factory and inputs (inputs.py), the shapes it is checked at (shapes.py), its float64 copy
(float64_copy.py), its export (exporting.py) and its reduced-precision models (convert.py).
`tconform.check` (tconform.api) runs it (docs/check.md).
"""

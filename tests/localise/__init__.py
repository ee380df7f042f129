"""Localisation's tests; graphs.py builds ONNX graphs whose node scopes mirror a small module."""

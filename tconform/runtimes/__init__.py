"""Runtimes that execute a case: ONNX Runtime per execution provider, and PyTorch eager.

Each runtime opens a session for one model and runs it on named numpy inputs, returning the
outputs in the case's output order, and says what really ran (`providers`).
"""

"""Steppers: the one thing the decoding driver asks of a runtime, the next step's
log-probabilities, with and without a key/value cache.

A stepper holds one batch of sequences. `start` encodes the source; `step` feeds one new token
per sequence (with whether it is a real token or left padding) and returns the log-probabilities
of the token after it, in float64; `reorder` keeps, repeats or permutes sequences (beam search
expands each source into its beams and follows the surviving ones).

Every runtime is reached through the same `run(feeds) -> outputs` of the models opened by the
execution layer (tconform.execution.Opened), so a stepper is the same code for the float64
oracle, PyTorch, ONNX Runtime and OpenVINO: it only differs in the opened models it is given,
one per generation model (tconform.registry.GENERATION_CASES).

On a runtime with device memory (ONNX Runtime's CUDA provider) the cached stepper runs with IO
binding (`run_bound`): the keys and values stay on the device between steps, and only the new
token's log-probabilities come back; beam search's reorder gathers them there too, with a
one-node Gather on the same provider (docs/generation.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from tconform import registry
from tconform.config import ModelConfig
from tconform.oracle import Params
from tconform.registry import ENCODER, LOG_PROBS, PREFIX, STEP


class StepModel(Protocol):
    """One generation model as a stepper runs it (an opened model, or the oracle's)."""

    device: tuple[str, int]  # where it keeps its outputs between steps ("cpu": the host)

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]: ...


class Stepper(Protocol):
    def start(self, src_ids: np.ndarray, src_keep: np.ndarray) -> None: ...

    def step(self, tokens: np.ndarray, keep: np.ndarray) -> np.ndarray: ...

    def reorder(self, rows: np.ndarray) -> None: ...


@dataclass
class OracleSession:
    """A generation model computed by the float64 oracle."""

    case: registry.Case
    cfg: ModelConfig
    params: Params
    device: tuple[str, int] = ("cpu", 0)

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        names = [spec.name for spec in self.case.outputs(self.cfg)]
        values = registry.run_oracle(self.case, self.cfg, self.params, feeds)
        return dict(zip(names, values, strict=True))


def oracle_sessions(cfg: ModelConfig, params: Params) -> dict[str, StepModel]:
    return {case.name: OracleSession(case, cfg, params) for case in (ENCODER, STEP, PREFIX)}


# The cached stepper's state that lives where the session runs: the keys and values.
DEVICE_STATE = ("past_k", "past_v", "cross_k", "cross_v")


@dataclass
class CachedStepper:
    """Encoder once, then the decoder-step model with the key/value cache.

    With `bound` (ONNX Runtime sessions) the runs use IO binding and the keys/values in the
    state are OrtValues on the provider's device; otherwise they are NumPy arrays."""

    sessions: Mapping[str, StepModel]
    cfg: ModelConfig
    dtype: type = np.float32  # of the cache and the memory (float64 for the oracle)
    bound: bool = False
    state: dict = field(default_factory=dict)

    def _run(self, case: registry.Case, feeds: dict, device_outputs: set[str]) -> dict:
        session = self.sessions[case.name]
        if self.bound:
            return session.run_bound(feeds, keep=device_outputs)
        return session.run(feeds)

    def start(self, src_ids: np.ndarray, src_keep: np.ndarray) -> None:
        encoded = self._run(
            ENCODER, {"src_ids": src_ids, "src_keep": src_keep}, {"memory", *DEVICE_STATE}
        )
        empty = (self.cfg.n_layers, len(src_ids), self.cfg.n_heads, 0, self.cfg.d_head)
        self.state = {
            "src_keep": src_keep,
            "past_keep": np.zeros((len(src_ids), 0), dtype=bool),
            "past_k": np.zeros(empty, dtype=self.dtype),
            "past_v": np.zeros(empty, dtype=self.dtype),
            "cross_k": encoded["cross_k"],
            "cross_v": encoded["cross_v"],
        }

    def step(self, tokens: np.ndarray, keep: np.ndarray) -> np.ndarray:
        past = self.state["past_keep"]
        feeds = {
            "tgt_ids": tokens.astype(np.int64)[:, None],
            "position": np.full(len(tokens), past.shape[1], dtype=np.int64),
            "new_keep": keep[:, None],
            **self.state,
        }
        outputs = self._run(STEP, feeds, {"present_k", "present_v"})
        self.state.update(
            past_keep=np.concatenate([past, keep[:, None]], axis=1),
            past_k=outputs["present_k"],
            past_v=outputs["present_v"],
        )
        return outputs["log_probs"][:, 0, :].astype(np.float64)

    def reorder(self, rows: np.ndarray) -> None:
        if np.array_equal(rows, np.arange(len(self.state["src_keep"]))):
            return  # nothing moves: the cache stays where it is
        self.state = {
            name: self._take(value, rows, axis=1 if name in DEVICE_STATE else 0)
            for name, value in self.state.items()
        }

    def _take(self, value, rows: np.ndarray, axis: int):
        if isinstance(value, np.ndarray):
            return np.take(value, rows, axis=axis)
        return self.sessions[STEP.name].take(value, rows, axis)  # on the device it lies on

    def cache_location(self) -> str:
        """Where the keys/values live between steps: the device type (IO binding) or 'numpy'."""
        return self.sessions[STEP.name].device[0] if self.bound else "numpy"

    def cache_bytes(self) -> int:
        """Bytes of the self-attention cache and the cross-attention keys/values held now."""
        itemsize = np.dtype(self.dtype).itemsize
        return sum(
            itemsize * int(np.prod(np.shape(v) if isinstance(v, np.ndarray) else v.shape()))
            for v in (self.state[name] for name in DEVICE_STATE)
        )


@dataclass
class PrefixStepper:
    """Encoder once, then the whole prefix through the decoder every step (no cache)."""

    sessions: Mapping[str, StepModel]
    cfg: ModelConfig
    state: dict[str, np.ndarray] = field(default_factory=dict)

    def start(self, src_ids: np.ndarray, src_keep: np.ndarray) -> None:
        encoded = self.sessions[ENCODER.name].run({"src_ids": src_ids, "src_keep": src_keep})
        batch = len(src_ids)
        self.state = {
            "memory": encoded["memory"],
            "src_keep": src_keep,
            "tgt_ids": np.zeros((batch, 0), dtype=np.int64),
            "tgt_keep": np.zeros((batch, 0), dtype=bool),
        }

    def step(self, tokens: np.ndarray, keep: np.ndarray) -> np.ndarray:
        self.state["tgt_ids"] = np.concatenate(
            [self.state["tgt_ids"], tokens.astype(np.int64)[:, None]], axis=1
        )
        self.state["tgt_keep"] = np.concatenate([self.state["tgt_keep"], keep[:, None]], axis=1)
        log_probs = self.sessions[PREFIX.name].run(dict(self.state))[LOG_PROBS.name]
        return log_probs[:, 0, :].astype(np.float64)

    def reorder(self, rows: np.ndarray) -> None:
        self.state = {name: value[rows] for name, value in self.state.items()}


def make_stepper(
    sessions: Mapping[str, StepModel], cfg: ModelConfig, cache: bool, oracle: bool = False
) -> Stepper:
    """A stepper over `sessions`: with the cache or the whole prefix each step."""
    if cache:
        # IO binding where the provider keeps tensors off the host; on the CPU provider NumPy
        # feeds measured 3-5 % faster per token (docs/generation.md), so the cache stays NumPy.
        bound = all(s.device[0] != "cpu" for s in sessions.values())
        return CachedStepper(sessions, cfg, np.float64 if oracle else np.float32, bound)
    return PrefixStepper(sessions, cfg)

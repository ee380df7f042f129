"""Train the reference Transformer on a synthetic task; write a checkpoint
(tconform.studies.checkpoints).

    python scripts/train_checkpoint.py                 # reverse, the tiny preset, 3000 steps
    python scripts/train_checkpoint.py --steps 20 --out ck   # a short run elsewhere

Why: a model that has learned something has wide top-1 logit margins, so a token that int8 or
bfloat16 flips is a real error, unlike with random weights. The run is deterministic (seeded
NumPy data, deterministic torch algorithms, one thread): the same command and the same torch
build give bit-identical weights and the same .npz sha256. Different CPUs or torch versions may
round differently, hence the torch version in the record.

Writes <out>/<task>.npz (float32, the Transformer's parameter names) and <out>/<task>.json
(config, task, training record, held-out scores under the float64 oracle, sha256, command).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch
from torch.nn import functional as F

from tconform.config import PRESETS, ModelConfig
from tconform.files import sha256_bytes
from tconform.reference import Transformer
from tconform.studies import checkpoints
from tconform.weights import load_params, make_params

PRESET = "tiny"  # its dimensions learn reverse in a few thousand steps
THREADS = 1  # a fixed count: a reduction's order, and so its rounding, may follow it
BATCH = 128
LEARNING_RATE = 5e-3
WARMUP = 200  # then linear decay to 0: the last steps settle instead of jumping about
CLIP = 1.0
EVAL_SEED = 1
EVAL_COUNT = 512
DEFAULT_OUT = Path(__file__).resolve().parents[1] / "tconform" / "data" / "checkpoints"


def train(cfg: ModelConfig, task: str, steps: int, seed: int) -> tuple[Transformer, float]:
    """(trained float32 model, the last step's loss). Starts from tconform.weights' draw."""
    torch.manual_seed(seed)  # nothing draws from torch today; fixed in case something will
    model = Transformer(cfg)
    load_params(model, make_params(model, seed)).train()
    optimizer = torch.optim.Adam(model.parameters(), lr=LEARNING_RATE, betas=(0.9, 0.98))
    decay = max(steps - WARMUP, 1)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min((s + 1) / WARMUP, max(0.0, (steps - s) / decay))
    )
    rng = np.random.default_rng([seed, 1])
    loss = torch.tensor(float("nan"))
    for _ in range(steps):
        src_ids, src_keep = checkpoints.draw_sources(cfg, rng, BATCH, held_out=False)
        targets = checkpoints.answers(task, src_ids, src_keep)
        tgt_ids, tgt_keep = checkpoints.teacher_inputs(targets)
        logits, _ = model(*map(torch.from_numpy, (src_ids, src_keep, tgt_ids, tgt_keep)))
        scored = torch.from_numpy(tgt_keep)
        loss = F.cross_entropy(logits[scored], torch.from_numpy(targets)[scored])
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        optimizer.step()
        schedule.step()
    return model.eval(), loss.item()


def margin_summary(margins: np.ndarray) -> dict[str, float]:
    return {
        "median": round(float(np.median(margins)), 4),
        "p5": round(float(np.percentile(margins, 5)), 4),
        "min": round(float(margins.min()), 4),
    }


def evaluate(cfg: ModelConfig, task: str, params: dict[str, np.ndarray], seed: int) -> dict:
    """Held-out scores and top-1 margins of the float64 oracle's greedy decoding; the margins
    of tconform.weights' random draw on the same sources, for comparison."""
    src_ids, src_keep = checkpoints.held_out_batch(cfg, EVAL_COUNT, EVAL_SEED)
    result = checkpoints.oracle_greedy(cfg, params, src_ids, src_keep)
    random_params = make_params(Transformer(cfg), seed)
    random = checkpoints.oracle_greedy(cfg, random_params, src_ids, src_keep)
    scores = checkpoints.score(task, src_ids, src_keep, result.tokens)
    return {
        "seed": EVAL_SEED,
        "count": EVAL_COUNT,
        "decoding": "greedy, float64 oracle, key/value cache",
        **{name: round(value, 6) for name, value in scores.items()},
        "top1_margin": margin_summary(checkpoints.top1_margins(result)),
        "random_weights_top1_margin": margin_summary(checkpoints.top1_margins(random)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", choices=sorted(checkpoints.TASKS), default="reverse")
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="folder for the files")
    args = parser.parse_args()

    torch.set_num_threads(THREADS)
    torch.set_num_interop_threads(THREADS)
    torch.use_deterministic_algorithms(True)
    cfg = PRESETS[PRESET]

    start = time.perf_counter()
    model, loss = train(cfg, args.task, args.steps, args.seed)
    seconds = time.perf_counter() - start
    arrays = {name: p.detach().numpy().astype(np.float32) for name, p in model.named_parameters()}
    args.out.mkdir(parents=True, exist_ok=True)
    data = checkpoints.write_npz(args.out / f"{args.task}.npz", arrays)
    params = {name: value.astype(np.float64) for name, value in arrays.items()}
    held_out = evaluate(cfg, args.task, params, args.seed)

    # The options that decide the weights; --out only says where they go.
    command = (
        f"python scripts/train_checkpoint.py --task {args.task} --steps {args.steps} "
        f"--seed {args.seed}"
    )
    record = {
        "name": args.task,
        "task": args.task,
        "preset": PRESET,
        "config": cfg.to_dict(),
        "training": {
            "seed": args.seed,
            "steps": args.steps,
            "batch": BATCH,
            "optimizer": f"Adam(lr={LEARNING_RATE}, betas=(0.9, 0.98)), clip {CLIP}",
            "schedule": f"linear warmup {WARMUP} steps, then linear decay to 0",
            "threads": THREADS,
            "torch": torch.__version__,
            "final_loss": float(f"{loss:.6g}"),
        },
        "held_out": held_out,
        "sha256": sha256_bytes(data),
        "bytes": len(data),
        "command": command,
    }
    (args.out / f"{args.task}.json").write_text(json.dumps(record, indent=2) + "\n")
    print(
        f"{args.task}: {args.steps} steps in {seconds:.1f} s, loss {loss:.3g}; held-out token "
        f"accuracy {held_out['token_accuracy']:.4f}, sequences {held_out['sequence_accuracy']:.4f}"
        f"; top-1 margin median {held_out['top1_margin']['median']}, p5 "
        f"{held_out['top1_margin']['p5']}; {len(data)} bytes, sha256 {record['sha256']}"
    )


if __name__ == "__main__":
    main()

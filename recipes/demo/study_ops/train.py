"""The demo's train stage: a logistic-regression classifier on the feature table, over every rank.

Run by habitrun (or torchrun) once per rank. It reads the ``table`` stage's
result from $HABITRUN_INPUTS, joins the rank group with
``init_process_group("gloo")`` from the torchrun environment, trains with
DistributedDataParallel on the CPU (each rank a shard of the subjects), and
rank 0 writes model.pt and metrics.json into $HABITRUN_WORKDIR.
"""

from __future__ import annotations

import csv
import json
import os
from datetime import timedelta
from pathlib import Path

from habitrun.launcher import record

NEEDS_TORCH = (
    "the demo's train stage needs PyTorch: pip install 'habitrun[train]' "
    "(CPU build: pip install torch==2.13.0)"
)
SEED = 0
STEPS = 300
LR = 0.1


def load_table(path: str) -> tuple[list[str], list[list[float]], list[float]]:
    """(feature names, rows of features, 0/1 labels) of the subjects that have a label."""
    with open(path, newline="") as handle:
        reader = csv.reader(handle)
        header = next(reader)
        columns = header[2:]
        rows, labels = [], []
        for line in reader:
            if len(line) != len(header) or line[1].strip() == "":
                continue
            labels.append(float(line[1]))
            rows.append([float(v) for v in line[2:]])
    return columns, rows, labels


@record
def main() -> dict:
    try:
        import torch
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel
    except ImportError:
        raise SystemExit(NEEDS_TORCH) from None

    inputs = json.loads(Path(os.environ["HABITRUN_INPUTS"]).read_text())
    table = inputs["table"]["table"]
    workdir = Path(os.environ["HABITRUN_WORKDIR"])
    dist.init_process_group("gloo", timeout=timedelta(seconds=120))
    try:
        rank, world = dist.get_rank(), dist.get_world_size()
        columns, rows, labels = load_table(table)
        x_all = torch.tensor(rows, dtype=torch.float32)
        y_all = torch.tensor(labels, dtype=torch.float32).unsqueeze(1)
        mean = x_all.mean(dim=0)
        std = x_all.std(dim=0).clamp_min(1e-6)
        x_all = (x_all - mean) / std
        x, y = x_all[rank::world], y_all[rank::world]  # this rank's shard

        torch.manual_seed(SEED)
        model = DistributedDataParallel(torch.nn.Linear(len(columns), 1))
        optim = torch.optim.SGD(model.parameters(), lr=LR)
        loss_fn = torch.nn.BCEWithLogitsLoss()
        for _ in range(STEPS):
            optim.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()  # DDP all-reduces the gradients across ranks here
            optim.step()

        with torch.no_grad():
            logits = model(x)
            stats = torch.tensor(
                [
                    float(((logits > 0).float() == y).sum()),
                    float(loss_fn(logits, y)) * len(y),
                    float(len(y)),
                ]
            )
        dist.all_reduce(stats)  # sum correct predictions, loss and counts over every shard
        correct, loss_sum, count = stats.tolist()
        metrics = {
            "accuracy": round(correct / count, 4),
            "loss": round(loss_sum / count, 4),
            "world_size": world,
            "n_subjects": int(count),
            "steps": STEPS,
            "evaluated_on": "training subjects",
        }
        if rank == 0:
            torch.save(
                {"state_dict": model.module.state_dict(), "columns": columns, "mean": mean, "std": std},
                workdir / "model.pt",
            )
            (workdir / "metrics.json").write_text(json.dumps(metrics, indent=2))
            metrics["model"] = str(workdir / "model.pt")
            print(f"accuracy {metrics['accuracy']:.3f} (loss {metrics['loss']:.3f}) on {int(count)} subjects over {world} ranks")
        return metrics
    finally:
        dist.destroy_process_group()

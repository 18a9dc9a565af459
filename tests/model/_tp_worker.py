"""One rank of the TP test (tests/model/test_tp.py launches two with torchrun, gloo on CPU).
Each rank runs every guard on two batches and saves its outputs and its own sync counts."""
import os
import sys

import torch

from lora_moe_lab.model.decoder import build_decoder_lab
from lora_moe_lab.model.guards import count_guard_syncs, guard_names
from lora_moe_lab.model.tp import init_tp

BATCHES = [(["a", None, "b"], [3, 5, 2]), (["a", "a"], [4, 4])]  # unequal and equal lengths


def main(out_dir: str, guard_sites: float, device="cpu", backend="torch", preset="tiny", num_layers=None) -> None:
    tp = init_tp(device=device, timeout_s=60)
    lab = build_decoder_lab(preset, num_layers=num_layers, backend=backend, dtype="float32",
                            guard_sites=guard_sites, tp=tp)
    lab.pool.load("a", rank=8)
    lab.pool.load("b", rank=4)
    result = {"rank": tp.rank, "size": tp.size, "intermediate": lab.shape.intermediate, "outs": {}, "syncs": {}}
    for b, (adapters, counts) in enumerate(BATCHES):
        batch, tensors = lab.make_batch(adapters, counts)
        x = lab.random_input(batch.num_tokens, seed=b)
        for g in guard_names():
            with count_guard_syncs() as c:  # this rank's own guard syncs
                result["outs"][b, g] = lab.model(x, batch, tensors, guard=g).cpu()
            result["syncs"][b, g] = c.count
    torch.save(result, os.path.join(out_dir, f"rank{tp.rank}.pt"))
    tp.destroy()


if __name__ == "__main__":
    a = sys.argv[1:]  # out_dir guard_sites [device backend preset num_layers]
    main(a[0], float(a[1]), *a[2:5], *[int(n) for n in a[5:6]])

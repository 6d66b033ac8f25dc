"""Keeping the ranks of a tensor-parallel target in step (``from_pretrained(..., tp_plan="auto")`` under torchrun).

Every rank runs the whole loop, and every target forward is a collective: the ranks must propose trees of the same
shape at every step. They could differ only in the measured seconds γ ``"auto"`` is chosen from, and in the random
state under ``do_sample=True``: docs/multi-gpu.md says how each is kept in step.
"""

from __future__ import annotations

import hashlib

import torch
import torch.distributed as dist

from .controller import _CARRIED


class RankAgreement:
    """The collectives that keep one call's ranks deciding alike, over the tensor-parallel process ``group`` with
    tensors on ``device`` (CPU for gloo)."""

    def __init__(self, group, device: torch.device):
        self.group, self.device = group, device

    @classmethod
    def of(cls, model) -> RankAgreement | None:
        """The agreement for ``model``'s tensor-parallel ranks, or `None` when it is not split so."""
        if (getattr(model, "tp_size", None) or 1) <= 1 or not (dist.is_available() and dist.is_initialized()):
            return None
        mesh = getattr(model, "_device_mesh", None)  # transformers keeps the ("pp", "fsdp", "tp") mesh here
        tp_mesh = mesh is not None and "tp" in (getattr(mesh, "mesh_dim_names", None) or ())
        group = mesh.get_group("tp") if tp_mesh else dist.group.WORLD
        return cls(group, torch.device("cpu") if dist.get_backend(group) == "gloo" else model.device)

    def slowest(self, *seconds: float) -> tuple[float, ...]:
        """Each of ``seconds`` as the slowest rank measured it: what the step cost the group."""
        values = torch.tensor(seconds, dtype=torch.float64, device=self.device)
        dist.all_reduce(values, op=dist.ReduceOp.MAX, group=self.group)
        return tuple(values.tolist())

    def align(self, controller) -> None:
        """Start ``controller`` from the first rank's remembered state and feed it the slowest rank's seconds."""
        box = [{name: getattr(controller, name) for name in _CARRIED}]
        dist.broadcast_object_list(box, group=self.group, group_src=0, device=self.device)
        vars(controller).update(box[0])
        controller.agree_seconds = self.slowest

    def check_random_state(self, model_device: torch.device) -> None:
        """Raise `ValueError` on every rank unless all ranks' global random generators (CPU, and the model's
        accelerator) stand in the same state."""
        digest = hashlib.sha256(torch.get_rng_state().numpy().tobytes())
        if model_device.type == "cuda":
            digest.update(torch.cuda.get_rng_state(model_device).numpy().tobytes())
        mine = torch.frombuffer(bytearray(digest.digest()[:8]), dtype=torch.int64).to(self.device)
        every = [torch.empty_like(mine) for _ in range(dist.get_world_size(self.group))]
        dist.all_gather(every, mine, group=self.group)
        if any(not torch.equal(other, every[0]) for other in every):
            raise ValueError(
                "do_sample=True under tensor parallelism needs the same random state on every rank, or the ranks would "
                f"draw different tokens: the {len(every)} ranks' generators differ. Seed every rank alike before "
                "generate, e.g. torch.manual_seed(seed) or transformers.set_seed(seed) with one seed on all ranks"
            )

"""Keeping the ranks of a tensor-parallel target in step (``from_pretrained(..., tp_plan="auto")`` under torchrun).

Every rank of the target's tensor-parallel group runs the whole loop on the same prompt with the same drafter, and every
target forward is a collective (each attention and MLP ends in an all-reduce, the LM head in an all-gather): the ranks
must propose trees of the same shape at every step, or their forwards' collectives no longer match. What a step decides
from is identical on every rank (the target's logits come out of those collectives bit for bit; a replicated draft, or a
GLIDE sharded like the target, computes the same numbers from the same inputs), except for two things:

* the clock: γ ``"auto"`` is chosen from measured seconds (:mod:`~hf_specdraft.core.controller`), which differ by rank.
  The controller is fed the slowest rank's seconds (one all-reduce of two numbers per step, :class:`RankAgreement`)
  and starts every call from rank 0's remembered state (one broadcast per call), so every rank chooses the same γ;
* the random state, with ``do_sample=True``: every draw (draft tokens, acceptance, the target's own token) comes from
  torch's global generator, so the ranks draw alike only if they were seeded alike. A sampling call compares the
  ranks' generator states first (one all-gather) and refuses to start when they differ.

No other rank-dependent input exists: CPU few-token linears (timed per rank) are left off under tensor parallelism.
"""

from __future__ import annotations

import hashlib

import torch
import torch.distributed as dist

from .controller import _CARRIED


class RankAgreement:
    """The collectives that keep one call's ranks deciding alike (see the module docstring).

    Args:
        group: the tensor-parallel process group. device: where its collectives' tensors live (CPU for gloo).
    """

    def __init__(self, group, device: torch.device):
        self.group, self.device = group, device

    @classmethod
    def of(cls, model) -> RankAgreement | None:
        """The agreement for ``model``'s ranks (the process group its tensor parallelism splits it over), or `None` when
        it is not split by tensor parallelism."""
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

    def from_first_rank(self, state: dict) -> dict:
        """The group's first rank's ``state`` (a picklable dict), on every rank."""
        box = [state]
        dist.broadcast_object_list(box, group=self.group, group_src=0, device=self.device)
        return box[0]

    def align(self, controller) -> None:
        """Start ``controller`` from the first rank's remembered state (each rank recalled its own, from its memory or
        its machine's file) and feed it the slowest rank's seconds from now on."""
        state = self.from_first_rank({name: getattr(controller, name) for name in _CARRIED})
        for name, value in state.items():
            setattr(controller, name, value)
        controller.agree_seconds = self.slowest

    def check_random_state(self, model_device: torch.device) -> None:
        """Raise `ValueError` on every rank unless all ranks' global random generators (CPU, and the model's
        accelerator) stand in the same state: only then do their draws agree token for token."""
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

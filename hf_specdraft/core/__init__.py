"""The core every method shares: one speculative decoding loop for any batch size and the steps it is made of.

Read bottom-up, as the loop runs a step:

* :mod:`.tree`: a proposal as data (tokens + parents) and the one builder of its mask and positions;
* :mod:`.stats`, :mod:`.rows`: per-step statistics, the per-request row and the target's scores at its nodes;
* :mod:`.support`: which targets can verify trees, chains, or nothing;
* :mod:`.verify`: the inputs of the one target forward over every row's tree (per-layer-type masks, batch masks);
* :mod:`.cache`: compaction, repacking, windows and draft-cache re-syncs;
* :mod:`.acceptance`: greedy, speculative sampling, lenient and conditional rules;
* :mod:`.batch_drafting`, :mod:`.drafting`: the drafter base classes, the draft-model drafter, one draft forward
  per batch;
* :mod:`.inputs`: the call's checks, one drafter and one set of logits processors per row;
* :mod:`.projection`, :mod:`.validation`: CPU few-token linears, option checks;
* :mod:`.loop`: ``speculative_generate`` and the step.

Every module here imports only torch, transformers, the standard library and its siblings (``from .x import y``):
the checkpoint-shipped ``custom_generate/`` folder is written from these very files
(:func:`hf_specdraft.cape.write_custom_generate`). The core imports no method; methods import the core.
"""

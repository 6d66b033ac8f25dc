"""The core every method shares: one speculative decoding loop for any batch size and the steps it is made of.

Read bottom-up, as the loop runs a step:

* :mod:`.tree`: a proposal as data (tokens + parents) and the one builder of its mask and positions;
* :mod:`.stats`, :mod:`.rows`: per-step statistics, the per-request row and the target's scores at its nodes;
* :mod:`.support`: which targets can verify trees, chains, or nothing;
* :mod:`.verify`: the inputs of the one target forward over every row's tree (per-layer-type masks, batch masks);
* :mod:`.host`: host data onto the device without a sync, and host tensors made cheaply;
* :mod:`.cache`: compaction, repacking, windows and draft-cache re-syncs;
* :mod:`.acceptance`: greedy, speculative sampling, lenient and conditional rules;
* :mod:`.suffix_match`: the longest earlier occurrence of the text's suffix (Max-Gram's match; GLIDE copies from it);
* :mod:`.emission`: one row's share of a step: its accepted path by its rule, emitted where ``generate`` would stop
  (the stop checks on host tokens);
* :mod:`.traits`: what a drafter declares to the loop (``DrafterTraits``), kept on each row;
* :mod:`.batch_drafting`, :mod:`.drafting`: the drafter base classes, the draft-model drafter, the registry that picks a
  drafter for a draft model's type, one draft forward per batch;
* :mod:`.target_state`, :mod:`.state_drafting`: the target's hidden states for the drafters that ask for them, and
  transformers' own drafters that read them (Gemma 4's assistants, DFlash);
* :mod:`.inputs`: the call's checks, one drafter and one set of logits processors per row;
* :mod:`.projection`, :mod:`.validation`: CPU few-token linears, option checks;
* :mod:`.static_cache`, :mod:`.static_inputs`, :mod:`.static_verify`, :mod:`.compiled`: the static path: a cache the
  loop owns, a bucket's inputs edited in place, fixed-shape verification, and the compiled call that runs them;
* :mod:`.layouts`, :mod:`.static_layout`: where the target's cache lives during a call: one declared interface
  (``CacheLayout``), one object of it per call (a row's own cache, a padded batch's shared one, the static buffers);
* :mod:`.draft_cache`: a drafter's own cache and forward behind one interface (``DraftCache``), dynamic or static;
* :mod:`.clock`, :mod:`.controller`, :mod:`.controller_store`: a step's timing as the device sees it,
  γ chosen at run time, and what was learned kept on disk for the next process;
* :mod:`.meter`: the step's clock and its γ controller behind one object;
* :mod:`.distributed`: the ranks of a tensor-parallel target kept in step;
* :mod:`.outputs`: what a call returns (``generate``'s sequences or the output with its statistics);
* :mod:`.memory`: freed host memory handed back to the system when a call ends, once the process has grown (opt-in,
  ``HF_SPECDRAFT_TRIM_MIB``);
* :mod:`.loop`: ``speculative_generate``, the call's setup and the step: propose, verify, read back, accept, keep.

Beside the loop: :mod:`.hooks` holds what the package root lends the methods (CAPE's ``custom_generate/`` writer for GLIDE checkpoints).

Every module here imports only torch, transformers, the standard library and its siblings (``from .x import y``):
the checkpoint-shipped ``custom_generate/`` folder is written from the very files its entry point imports
(:func:`hf_specdraft.cape.write_custom_generate`). The core imports no method; methods import the core.
"""

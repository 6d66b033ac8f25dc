"""The core every method shares: one speculative decoding loop for any batch size and the steps it is made of.

What each module does, in one line, and what imports what: docs/layout.md. Read bottom-up, as the loop runs a step:
the proposal as data (:mod:`.tree`), statistics and rows (:mod:`.stats`, :mod:`.rows`), what a target can verify
(:mod:`.support`), the verification forward's inputs (:mod:`.verify`, :mod:`.host`), the cache (:mod:`.cache`), the
acceptance rules (:mod:`.acceptance`, :mod:`.suffix_match`), a row's emission (:mod:`.emission`), the drafters
(:mod:`.batch_drafting`, :mod:`.drafting`, :mod:`.draft_cache`, :mod:`.target_state`,
:mod:`.state_drafting`), the call's checks (:mod:`.inputs`, :mod:`.projection`, :mod:`.validation`), the static cache
(:mod:`.static_cache`), the cache layouts
(:mod:`.layouts`, :mod:`.static_layout`), costs and γ (:mod:`.controller`, :mod:`.controller_store`,
:mod:`.meter`), tensor parallelism (:mod:`.distributed`), the result (:mod:`.outputs`, :mod:`.memory`), and the loop
(:mod:`.loop`: ``speculative_generate``, the call's setup and the step).

Every module here imports only torch, transformers, the standard library and its siblings (``from .x import y``):
the checkpoint-shipped ``custom_generate/`` folder is written from the very files its entry point imports
(:func:`hf_specdraft.cape.write_custom_generate`). The core imports no method; methods import the core.
"""

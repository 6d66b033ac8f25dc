"""The core every method shares: one speculative decoding loop for any batch size and the steps it is made of.

Read bottom-up, as the loop runs a step (docs/layout.md says what each module does): the proposal (:mod:`.tree`),
statistics and rows (:mod:`.stats`, :mod:`.rows`), what a target can verify (:mod:`.support`), the verification
forward (:mod:`.verify`, :mod:`.host`), the cache (:mod:`.cache`), acceptance (:mod:`.acceptance`,
:mod:`.suffix_match`, :mod:`.ngram_table`), emission (:mod:`.emission`), the drafters (:mod:`.batch_drafting`,
:mod:`.drafting`, :mod:`.draft_cache`, :mod:`.target_state`, :mod:`.state_drafting`), the call's checks (:mod:`.inputs`,
:mod:`.projection`, :mod:`.validation`), the cache layouts (:mod:`.static_cache`, :mod:`.layouts`,
:mod:`.static_layout`), costs and γ (:mod:`.controller`, :mod:`.controller_store`, :mod:`.meter`), tensor parallelism
(:mod:`.distributed`), the result (:mod:`.outputs`, :mod:`.memory`), and the loop (:mod:`.loop`).

Every module imports only torch, transformers, the standard library and its siblings: the checkpoint-shipped
``custom_generate/`` folder is written from the very files its entry point imports. The core imports no method.
"""

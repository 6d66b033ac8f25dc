"""The recipes that trained the shipped drafters (and the small from-scratch target): ``python -m recipes.<name>`` from
the repository root. They import hf_specdraft; hf_specdraft never imports them (tests/test_layers.py checks it)."""

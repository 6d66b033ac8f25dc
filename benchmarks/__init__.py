"""The lab beside the library: benchmark studies and GPU runs that import hf_specdraft (never imported by it)."""

"""The loop's own time per step on the static path, eager and compiled (issue #35's "loop <= 10 % of a verify forward").

    python benchmarks/verification/static/loop_overhead.py benchmarks/verification/static/loop-overhead-cpu.json

Times every target forward of the static path (StaticTarget._forward) and reports the rest of each step: drafting a
fixed chain or nothing, the step's inputs and masks, acceptance, emission, statistics. SmolLM2 (the embedded default).
"""
import json, platform, sys, time

import torch
import transformers
from transformers import CompileConfig
from hf_specdraft.defaults import load_default
from hf_specdraft import speculative_generate
from hf_specdraft.core import compiled as C
from hf_specdraft.bench.methods import NullCandidateGenerator
from hf_specdraft.core.drafting import TreeCandidateGenerator
from hf_specdraft.core.tree import DraftTree
b = load_default(); t = b.target; tok = b.tokenizer
ids = tok("def quicksort(arr):\n", return_tensors="pt").input_ids
class Fixed(TreeCandidateGenerator):  # proposes 3 wrong tokens: every step verifies a 4-token bucket
    def propose(self, input_ids, target_cache=None):
        return DraftTree.chain(torch.tensor([5, 6, 7]))
spent = []
orig = C.StaticTarget._forward
def timed(self, **kw):
    s = time.perf_counter(); out = orig(self, **kw); spent.append(time.perf_counter() - s); return out
C.StaticTarget._forward = timed
cc = CompileConfig(); cc._compile_all_devices = True
rows = []
for name, gen in (("null", NullCandidateGenerator), ("fixed-3", Fixed)):
    for compile_config in (None, cc):
        speculative_generate(t, ids, candidate_generator=gen(), max_new_tokens=64, cache_implementation="static", compile_config=compile_config)  # warm
        spent.clear(); s = time.perf_counter()
        out = speculative_generate(t, ids, candidate_generator=gen(), max_new_tokens=64, cache_implementation="static", compile_config=compile_config, return_dict_in_generate=True)
        total = time.perf_counter() - s; steps = len(out.speculative_stats.steps)
        fwd = sum(spent[-steps:])
        row = {"drafter": name, "compiled": compile_config is not None, "steps": steps, "forward_ms_per_step": 1000 * fwd / steps,
               "loop_ms_per_step": 1000 * (total - fwd - out.speculative_stats.prefill_seconds) / steps}
        rows.append(row)
        print(row)
result = {"meta": {"hardware": platform.processor() or platform.machine(), "cpu": open("/proc/cpuinfo").read().split("model name")[1].split("\n")[0].strip("\t: ")
                   if platform.system() == "Linux" else platform.processor(), "threads": torch.get_num_threads(), "dtype": str(t.dtype),
                   "versions": {"torch": torch.__version__, "transformers": transformers.__version__}, "max_new_tokens": 64,
                   "command": "python benchmarks/verification/static/loop_overhead.py"}, "rows": rows}
if len(sys.argv) > 1:
    open(sys.argv[1], "w").write(json.dumps(result, indent=1) + "\n")

"""How the memory allowance defaults (Overheads.context_gib, .fragmentation) were chosen.

Grid search over the BLOOM runs of the reference set (nvidia-smi of the first node, and the
published out-of-memory outcomes). Prints the best pairs by worst relative error; a pair is only
acceptable when every OOM run is predicted above the GPU's memory and every run that ran within it.
Run: python bench/calibrate_overheads.py
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from formats.published import load_runs, compare_run, _skip_reason, run_to_inputs
from model.estimator import Evaluator
from model.specs import Options, Overheads
runs=[r for r in load_runs() if not _skip_reason(r) and r['source_group'].startswith('bloom')]
inputs=[(r, run_to_inputs(r)) for r in runs]
best=[]
for ctx in [2,2.5,3,3.5,4,4.5,5]:
  for frag in [0.05,0.08,0.1,0.12,0.15,0.18,0.2]:
    o=Options(overheads=Overheads(context_gib=ctx, fragmentation=frag))
    errs=[]; ok=True
    for r,(m,j,c,p,_) in inputs:
        ev=Evaluator(m,j,c,p.shape,o)
        mem=[x.total_gib for x in ev.memory]
        if r.get('oom') is True: ok &= max(mem)>80
        else: ok &= max(mem)<=80
        if r.get('peak_memory'): errs.append(abs(mem[0]-r['peak_memory'])/r['peak_memory'])
    errs.sort()
    best.append((max(errs), errs[len(errs)//2], ctx, frag, ok))
best.sort()
print('max_err  median_err  context_gib  fragmentation  oom_ok')
for b in best[:8]:
    print(f'{b[0]:.4f}   {b[1]:.4f}      {b[2]:<11}  {b[3]:<13}  {b[4]}')

"""What ptxas makes of the Gluon kernels, on any machine (no GPU): per kernel of each plan the
suite's compile check builds (conformance/laws/attention/hopper_compile.py), its shared memory,
spills, and the warpgroup waits ptxas injects (warning C7517: a wgmma's accumulator registers
read where ptxas cannot prove the wgmma retired, so it waits for every wgmma in flight).

    env -u TRITON_INTERPRET PYTHONPATH=. python perf/scripts/gluon_ptxas_report.py [--sass DIR] [--module PATH] [--order]

--sass DIR also writes each kernel's SASS (cuobjdump) there, to find where a wait landed.
--module PATH reports on a copy of flash_gluon.py instead (a variant, before any GPU runs it).
--order prints each kernel's wgmma order (hopper_compile.wgmma_order: where its waits sit
against its products and the softmax's exp2).  Two --sass folders of the same plans whose SASS
is the same instruction for instruction (addresses aside) compiled to the same kernels.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import re
import subprocess
import tempfile
from pathlib import Path

from triton.backends.nvidia.compiler import get_ptxas

from conformance.laws.attention.hopper_compile import (compile_launch, cpu_plans, gluon_launches, plan_cases, sass,
                                                       wgmma_order)


def ptxas_lines(ptx: str) -> list[str]:
    ptxas = get_ptxas(90).path
    with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
        f.write(ptx)
    run = subprocess.run([ptxas, "-v", "--gpu-name=sm_90a", f.name, "-o", os.devnull], capture_output=True, text=True)
    os.unlink(f.name)
    return [" ".join(line.split()) for line in run.stderr.splitlines() if re.search(r"spill|C75\d\d", line)]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--sass", default=None)
    p.add_argument("--module", default=None)
    p.add_argument("--order", action="store_true")
    a = p.parse_args()
    if a.module:  # the compile check's plans, built from the variant's tables and kernels
        spec = importlib.util.spec_from_file_location("gluon_variant", a.module)
        fg = importlib.util.module_from_spec(spec)
        sys.modules["gluon_variant"] = fg  # dataclasses look their module up
        spec.loader.exec_module(fg)
    else:
        fg = importlib.import_module("impl.attention.flash_gluon")
    cpu_plans(fg)
    for group, cases in plan_cases(fg.MUTANTS).items():
        for case in cases:
            for name, launch, tensors in gluon_launches(fg, *case):
                compiled = compile_launch(launch, tensors)
                label = f"{group} {case[1]} {case[2]} causal={case[3]} det={case[4]} {name}"
                print(f"{label}: shared {compiled.metadata.shared} B")
                for line in ptxas_lines(compiled.asm["ptx"]):
                    print(f"    {line}")
                if a.order:
                    print(f"    wgmma order: {wgmma_order(sass(compiled))}")
                if a.sass:
                    folder = Path(a.sass)
                    folder.mkdir(parents=True, exist_ok=True)
                    (folder / (re.sub(r"[^A-Za-z0-9]+", "_", label) + ".sass")).write_text(sass(compiled))


if __name__ == "__main__":
    main()
